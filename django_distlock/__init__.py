"""Distributed locks for Django, with the backend chosen in settings."""

# checks: registered where every user of the package arrives, not only in the app's
# ready(), which never runs without the app in INSTALLED_APPS (distlock.E005).
# Registering a function twice is a no-op in Django's registry.
from . import checks as _checks  # noqa: F401
from .context import holder_context
from .decorators import distlock, lock
from .exceptions import SelfDeadlock
from .handle import Lock
from .handler import DEFAULT_LOCK_ALIAS, locks
from .multilock import MultiLock
from .values import DEFAULT, Holder, LockInfo, LockOptions, LockPage, WaiterInfo

__version__ = "0.1.0"

__all__ = [
    "DEFAULT",
    "DEFAULT_LOCK_ALIAS",
    "Holder",
    "Lock",
    "LockInfo",
    "LockOptions",
    "LockPage",
    "MultiLock",
    "SelfDeadlock",
    "WaiterInfo",
    "distlock",
    "holder_context",
    "lock",
    "locks",
]
