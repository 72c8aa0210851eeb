"""Optional integrations with other packages (install the matching extra):
``health_check`` (django-health-check), ``prometheus`` (prometheus_client), and
``celery`` / ``celery_once`` (Celery: docs/tasks.md)."""
