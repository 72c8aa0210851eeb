"""Moved to :mod:`django_distlock.operations.health`; this path stays for imports (and URLconfs:
``health_view``) that name it."""

from ..operations.health import Health, check_health, health_view, probe

__all__ = ["Health", "check_health", "health_view", "probe"]
