"""Every error django-distlock raises.

Run-time lock failures derive from :class:`DistLockError`; setup mistakes
derive from Django's :class:`~django.core.exceptions.ImproperlyConfigured`.
Errors caused by a server or client library are chained to the original
exception (``raise ... from exc``).
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "BackendUnavailable",
    "DistLockError",
    "InvalidBackendOptions",
    "InvalidLockAlias",
    "InvalidLockName",
    "LockConfigurationError",
    "LockLost",
    "LockNotAcquired",
    "LockNotHeld",
    "LockTimeout",
    "UnsupportedOperation",
]


class DistLockError(Exception):
    """Base class of every run-time error of django-distlock."""


class LockNotAcquired(DistLockError):
    """The lock is held by someone else and was not had (non-blocking miss)."""

    def __init__(self, message: str, *, name: str | None = None, alias: str | None = None):
        super().__init__(message)
        self.name = name
        self.alias = alias


class LockTimeout(LockNotAcquired):
    """The lock was waited for until the timeout and not had."""


class LockNotHeld(DistLockError):
    """The operation needs the lock held by this handle, and it is not."""


class LockLost(LockNotHeld):
    """The handle held the lock, but the backend says it no longer does.

    The lease expired, was force-released, or the backend's session ended.
    Whatever the critical section did after the loss was not protected.
    """


class BackendUnavailable(DistLockError):
    """The lock server failed or could not be reached; chained to the client error."""


class UnsupportedOperation(DistLockError):
    """The backend, in its configured mode, cannot do this operation."""


class InvalidLockName(DistLockError, ValueError):
    """A lock name is not a string, is empty, too long or holds control characters."""


class LockConfigurationError(ImproperlyConfigured):
    """Base class of the setup mistakes found in the ``DISTLOCK`` setting."""


class InvalidLockAlias(LockConfigurationError, KeyError):
    """The alias is not configured in ``DISTLOCK``."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidBackendOptions(LockConfigurationError):
    """A backend's ``OPTIONS``, ``TTL``, ``TIMEOUT`` or ``KEY_PREFIX`` is unusable."""
