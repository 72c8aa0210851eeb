"""Optional integrations with other packages (install the matching extra):
``health_check`` (django-health-check) and ``prometheus`` (prometheus_client)."""
