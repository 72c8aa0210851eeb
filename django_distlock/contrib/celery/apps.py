from django.apps import AppConfig


class CeleryConfig(AppConfig):
    """Celery: tasks enqueued once (``QueueOnce``), retry policies for ``@distlock``'d
    tasks, the core's housekeeping task (``tasks``, found by ``autodiscover_tasks()``)
    and the testing kit's real workers (``testing``). No models."""

    name = "django_distlock.contrib.celery"
    label = "distlock_celery"
    verbose_name = "Distributed locks for Celery"
