"""Distributed locks for Django, with the backend chosen in settings."""

from .backends.base import DEFAULT, LockInfo, LockPage
from .decorators import distlock, lock
from .handler import DEFAULT_LOCK_ALIAS, locks
from .lease import Lock

__version__ = "0.1.0"

__all__ = [
    "DEFAULT",
    "DEFAULT_LOCK_ALIAS",
    "Lock",
    "LockInfo",
    "LockPage",
    "distlock",
    "lock",
    "locks",
]
