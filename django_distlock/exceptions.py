"""Every error django-distlock raises.

Run-time lock failures derive from :class:`DistLockError`; setup mistakes
derive from Django's :class:`~django.core.exceptions.ImproperlyConfigured`.
Errors caused by a server or client library are chained to the original
exception (``raise ... from exc``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.db.transaction import TransactionManagementError

__all__ = [
    "BackendUnavailable",
    "Deadlock",
    "DistLockError",
    "InvalidBackendOptions",
    "InvalidLockAlias",
    "InvalidLockName",
    "LeadershipLost",
    "LockConfigurationError",
    "LockLost",
    "LockNotAcquired",
    "LockNotHeld",
    "LockOrderViolation",
    "LockTimeout",
    "NotReplicated",
    "SelfDeadlock",
    "SemaphoreLimitMismatch",
    "StaleFencingToken",
    "UnsupportedOperation",
    "VersionConflict",
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


class SelfDeadlock(LockNotAcquired):
    """The thread (or asyncio task) would wait for a lock it already holds through
    another handle: the wait could only end at the timeout, so it ends at once.

    A :class:`LockNotAcquired`, so ``on_fail`` policies and ``except LockNotAcquired``
    see it as they would the timeout. Also importable from ``django_distlock`` and
    ``django_distlock.handle``."""


class Deadlock(LockNotAcquired):
    """The server refused this wait because it would close a cycle: sessions each
    waiting for a lock another of them holds (PostgreSQL's ``deadlock_detected``,
    40P01; MySQL's 3058 and MariaDB's 1213 from ``GET_LOCK``). Nothing was acquired;
    the other waits of the cycle go on. Take locks in one order (``multi_lock()``
    sorts its names), or release what you hold before waiting again.

    A :class:`LockNotAcquired`, so ``on_fail`` policies see it as a miss. Chained to the
    server's error."""


class LockOrderViolation(DistLockError):
    """A blocking acquire would take two lock classes in the reverse of an order seen
    before in this process (``DISTLOCK_CHECK_ORDER = "raise"``: ``ordering.py``): a
    deadlock waiting for two processes to meet. Raised before any server call; the
    message names both orders and where each was first seen."""


class LockNotHeld(DistLockError):
    """The operation needs the lock held by this handle, and it is not."""


class LockLost(LockNotHeld):
    """The handle held the lock, but the backend says it no longer does.

    The lease expired, was force-released, or the backend's session ended.
    Whatever the critical section did after the loss was not protected.
    """


class LeadershipLost(LockLost):
    """A leadership term is lost: leadership may have passed to another process
    (:class:`~django_distlock.leadership.Term`). Raised by ``term.check()``, and by the
    exit of a term lost without its leader having been told."""


class BackendUnavailable(DistLockError):
    """The lock server failed or could not be reached; chained to the client error."""


class NotReplicated(BackendUnavailable):
    """A grant (or an extension) was not acknowledged by ``OPTIONS["WAIT_REPLICAS"]``
    replicas in time (Redis ``WAIT``): a failover could lose it. A grant is undone
    before this is raised (the lock is not held); an extension leaves the lease at
    its previous, replicated end. See ``docs/redis.md``, "Sentinel and failover"."""


class TooManyLocks(DistLockError):
    """The process holds (or waits for) as many locks as the backend can safely keep in
    one session; nothing was sent (ZooKeeper: ``OPTIONS["MAX_SESSION_BYTES"]``)."""


class UnsupportedOperation(DistLockError):
    """The backend, in its configured mode, cannot do this operation."""


class InvalidLockName(DistLockError, ValueError):
    """A lock name is not a string, is empty, or holds control characters or lone surrogates."""


class SemaphoreLimitMismatch(DistLockError, ValueError):
    """The semaphore's stored limit and the one given differ (nothing was taken).

    The first use of a semaphore stores its ``limit`` on the server; a client
    passing another limit would admit more (or fewer) holders than the others.
    :attr:`stored` and :attr:`given` are the two limits.
    """

    def __init__(self, message: str, *, stored: int | None = None, given: int | None = None):
        super().__init__(message)
        self.stored = stored
        self.given = given


class VersionConflict(DistLockError, DatabaseError):
    """An optimistic write found the row changed (or deleted) since it was read.

    Nothing was written. :attr:`instance` is the object whose save or delete
    was refused, :attr:`expected_version` the version it was read at.
    Reload the object, re-apply the change and try again (see
    :func:`django_distlock.contrib.optimistic.retry_on_conflict`).
    """

    def __init__(self, message: str, *, instance: Any = None, expected_version: Any = None):
        super().__init__(message)
        self.instance = instance
        self.expected_version = expected_version


class StaleFencingToken(DistLockError, DatabaseError):
    """A fenced write carried a lower fencing token than the last one that wrote the row.

    Nothing was written: a newer holder of the lock has written since this
    holder's lease was granted, so this holder's lease is stale (expired
    while it was paused, force-released, ...). :attr:`token` is the refused
    token; :attr:`instance` the object (or None for a queryset write).
    """

    def __init__(self, message: str, *, instance: Any = None, token: int | None = None):
        super().__init__(message)
        self.instance = instance
        self.token = token


class LockConfigurationError(ImproperlyConfigured):
    """Base class of the setup mistakes found in the ``DISTLOCK`` setting."""


class InvalidLockAlias(LockConfigurationError, KeyError):
    """The alias is not configured in ``DISTLOCK``."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidBackendOptions(LockConfigurationError):
    """A backend's ``OPTIONS``, ``TTL``, ``TIMEOUT`` or ``KEY_PREFIX`` is unusable."""


class ConnectionInUse(UnsupportedOperation):
    """A database transaction-mode lock was asked for on a connection whose transaction
    holds another asyncio task's transaction-mode lock (tasks of one event loop share
    their thread's connection). Nothing was sent. See ``docs/database.md``."""


__all__.append("ConnectionInUse")


class AlreadyQueued(LockNotAcquired):
    """An enqueue-once task was not sent: an equal one is queued or running (its lock,
    :attr:`name` on :attr:`alias`, is held). See ``docs/tasks.md``."""


__all__.append("AlreadyQueued")


class LeaseInTransaction(UnsupportedOperation, TransactionManagementError):
    """A lock that must outlive the caller's transaction was asked for inside it, on a
    backend whose leases are written in that transaction (the database backend's lease
    mode on SQLite): its rollback would undo the grant. Nothing was written. Raised by
    :func:`~django_distlock.contrib.schedules.once_per_slot`; see ``docs/schedules.md``."""


__all__.append("LeaseInTransaction")
