from django.apps import AppConfig


class DistLockConfig(AppConfig):
    """The core: the lock tables of the database backend and the system checks. The
    admin pages, the audit trail and the rest are apps of ``django_distlock.contrib``."""

    name = "django_distlock"
    verbose_name = "Distributed locks (core)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
