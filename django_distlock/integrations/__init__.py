"""Integrations of django-distlock with other tools, each a module of its own imported
only by the site that uses it (``opentelemetry``)."""
