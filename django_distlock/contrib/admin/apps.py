from django.apps import AppConfig


class AdminConfig(AppConfig):
    """The held-locks pages of the Django admin and the ``distlock`` command: list,
    inspect and force-release held locks on every alias, prune, check health."""

    name = "django_distlock.contrib.admin"
    label = "distlock_admin"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.BigAutoField"
