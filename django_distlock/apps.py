from django.apps import AppConfig


class DistLockConfig(AppConfig):
    name = "django_distlock"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .handler import follow_audit

        follow_audit()  # the audit receivers, only while an alias audits
