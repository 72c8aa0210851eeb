"""Signals sent on lock events, and on an operator's force releases.

Each lock event is sent with ``sender`` = the backend class and the keyword
arguments ``backend``, ``alias``, ``name`` and ``fencing_token``; those sent by
a lock handle also carry ``handle``, the :class:`~django_distlock.Lock` (its
``holder``, ``owner_id`` and ``held_for`` describe the holder; None for a loss found
after the handle was dropped unreleased). ``lock_acquired`` and
``lock_not_acquired`` carry ``waited`` (seconds spent in ``acquire()``),
``lock_acquire_failed`` ``waited`` and ``error`` (the exception ``acquire()`` raised);
``lock_force_released`` carries no token and no handle but ``by_operator``
(True within :func:`by_operator`, where an operator signal below describes the
action). Receivers run on the hot path: keep them quick.

The operator signals are sent by the admin app (``django_distlock.contrib.admin``,
its pages and ``manage.py distlock release``) after the action, with who did it
and why; the audit app records them. A receiver that raises fails the action's
report (the locks freed stay freed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from django.dispatch import Signal

__all__ = [
    "by_operator",
    "is_by_operator",
    "lock_acquire_failed",
    "lock_acquired",
    "lock_force_released",
    "lock_lost",
    "lock_not_acquired",
    "lock_released",
    "lock_released_by_operator",
    "lock_renewed",
    "locks_bulk_released",
]

#: ``acquire()`` returned True: the lock is held (``waited``: seconds spent in it).
lock_acquired = Signal()
#: ``acquire()`` returned False: timed out, or busy without blocking.
lock_not_acquired = Signal()
#: ``acquire()`` raised (``error``: the exception): the server failed
#: (``BackendUnavailable``, also when the circuit fails fast), or refused the wait
#: (``Deadlock``), or the call was refused (``UnsupportedOperation``). ``waited``: seconds
#: spent in it. Not sent for the errors ``acquire()`` raises before it starts (bad
#: arguments, ``SelfDeadlock``, ``LockOrderViolation``).
lock_acquire_failed = Signal()
#: A held lock was released by its handle.
lock_released = Signal()
#: A held lock's lease was moved on (the watchdog's renewal, or ``extend()``): its
#: handle's ``expires_at`` is the new end. Sent off the hot path, in the renewing thread.
lock_renewed = Signal()
#: A handle learned its lock is gone (a release found it taken, a session ended, a renewal
#: was refused; ``mark_lost()``); sent once per grant, in the thread that learned it. A
#: release that raises ``LockLost`` for that loss raises only once its receivers returned.
lock_lost = Signal()
#: ``force_release()`` freed a lock held by someone (no token, no handle; ``by_operator``).
lock_force_released = Signal()

#: An operator force-released one lock (or found it no longer held by the holder shown):
#: ``sender`` None; ``alias``, ``name``, ``info`` (the :class:`~django_distlock.values.
#: LockInfo` the operator saw), ``actor``, ``reason``, ``freed`` (bool), ``held``
#: (seconds it had been held, or None).
lock_released_by_operator = Signal()
#: An operator released a selection of locks at once: ``sender`` None; ``selection``
#: (what was asked: its ``describe()``, ``host``, ``pid``, ``owner``), ``actor``,
#: ``reason``, ``freed`` (the LockInfos freed), ``skipped`` ((LockInfo, why) pairs).
locks_bulk_released = Signal()

_by_operator: ContextVar[bool] = ContextVar("django_distlock_by_operator", default=False)


@contextlib.contextmanager
def by_operator() -> Iterator[None]:
    """Within: the force releases sent are an operator's (``by_operator=True``), whose
    action is described by an operator signal sent after it."""
    token = _by_operator.set(True)
    try:
        yield
    finally:
        _by_operator.reset(token)


def is_by_operator() -> bool:
    """Whether the current context is within :func:`by_operator`."""
    return _by_operator.get()
