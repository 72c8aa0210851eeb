from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    """Jobs that run once per schedule slot across nodes (``once_per_slot``). The app
    has no models; installing it registers the jobs' system check at start-up (importing
    the module, as decorating a job does, registers it too)."""

    name = "django_distlock.contrib.schedules"
    label = "distlock_schedules"
    verbose_name = "Scheduled jobs run once per slot"
