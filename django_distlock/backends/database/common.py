"""The old home of :class:`DatabaseBackend` (now ``backend.py``, as in the other
backend packages); kept so that imports of ``django_distlock.backends.database.common``
keep working."""

from .backend import MAX_SERVER_WAIT, DatabaseBackend, is_busy, server_wait

__all__ = ["MAX_SERVER_WAIT", "DatabaseBackend", "is_busy", "server_wait"]
