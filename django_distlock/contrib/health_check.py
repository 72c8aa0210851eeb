"""A django-health-check 4 check of the lock backends (``pip install
django-distlock[health-check]``)::

    # urls.py
    from health_check.views import HealthCheckView

    path("ht/", HealthCheckView.as_view(checks=[
        "health_check.checks.Database",
        "django_distlock.contrib.health_check.LockBackends",   # every alias
        ("django_distlock.contrib.health_check.LockBackends", {"alias": "redis"}),
    ])),

Each alias' ``health()`` makes one round trip to its server (the database backend's
reads its lock table); an alias with ``AUDIT`` also reads the audit trail's table. A failure is
reported without its details (the health page may be public); they are logged.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging

from django.core.exceptions import ImproperlyConfigured
from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from django_distlock.exceptions import DistLockError
from django_distlock.handler import locks
from django_distlock.health import probe

__all__ = ["LockBackends"]

logger = logging.getLogger("django_distlock")


@dataclasses.dataclass
class LockBackends(HealthCheck):
    """Healthy when every lock backend (or the one ``alias``) answers ``health()``."""

    alias: str | None = None
    timeout = datetime.timedelta(seconds=5)

    def run(self) -> None:
        aliases = [self.alias] if self.alias is not None else list(locks)
        failed = []
        for alias in aliases:
            try:
                probe(alias)
            except (DistLockError, ImproperlyConfigured):
                logger.warning("Lock backend %r failed its health check", alias, exc_info=True)
                failed.append(alias)
        if failed:
            raise ServiceUnavailable(f"lock backends unavailable: {', '.join(failed)}")
