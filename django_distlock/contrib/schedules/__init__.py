"""Scheduled jobs that run once per schedule slot across nodes (ShedLock's model).

Every node runs the same schedule (a crontab line, Celery beat on each node, a
loop), so every node fires the job for the same slot at about the same moment.
:func:`once_per_slot` makes the firings race for one lock with a single
non-blocking try: the winner runs the job, every loser returns at once. Two
durations shape the lock:

- ``max_hold`` is the lease the winner takes: the longest the job keeps the
  lock from the grant. A node that crashes mid-job frees the job after it, on
  the lock server's clock. A job that runs longer loses the lock meanwhile, and
  another node may start the same job.
- ``min_hold`` is the shortest: after a run shorter than ``min_hold`` the lock is
  not released but its lease is shortened (or lengthened) to end ``min_hold``
  after the grant. A node whose clock or schedule fires it up to ``min_hold``
  late finds the lock still held and skips the slot that was already run.

Keeping the lock is a lease whose end is set by the lock server, so it needs
a backend whose locks expire (``supports_expiry``); ``distlock.W040`` says so for
a job on any other alias. The lease must also outlive the caller's transaction:
a call inside one, on a backend that would write the lease in it (SQLite), is
refused before anything is written. See ``docs/schedules.md``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from django_distlock.context import enter, leave
from django_distlock.exceptions import DistLockError, LeaseInTransaction, LockLost
from django_distlock.handle import hold_of
from django_distlock.handler import DEFAULT_LOCK_ALIAS, locks
from django_distlock.names import validate_name
from django_distlock.values import MIN_TTL, validate_ttl

if TYPE_CHECKING:
    from django_distlock.backends.base import BaseLockBackend
    from django_distlock.handle import Lock

__all__ = ["ScheduledJob", "once_per_slot", "scheduled_jobs"]

logger = logging.getLogger("django_distlock")

F = TypeVar("F", bound=Callable[..., Any])
OnLost = Literal["raise", "log"]


@dataclass(frozen=True)
class ScheduledJob:
    """One job decorated with :func:`once_per_slot`: what the system check reads."""

    #: The lock's name: one per job, shared by every node that runs it.
    name: str
    #: The ``DISTLOCK`` alias whose lock decides the slot.
    using: str
    #: The lease the winner takes, in seconds (the longest it keeps the lock).
    max_hold: float
    #: The shortest time the lock is kept from the grant, in seconds (0: released).
    min_hold: float
    #: ``module.qualname`` of the decorated function.
    function: str


#: The jobs, held weakly: a job goes with its decorated function (a test's local one).
_jobs: weakref.WeakValueDictionary[tuple[str, str, str], ScheduledJob] = (
    weakref.WeakValueDictionary()
)
_jobs_mutex = threading.Lock()


def scheduled_jobs() -> list[ScheduledJob]:
    """Return every job decorated with :func:`once_per_slot` in this process so far.

    :returns: the jobs whose decorated functions still exist, in the order they were
        decorated (one entry per function, name and alias; decorating again with
        other durations replaces it).
    """
    with _jobs_mutex:
        return list(_jobs.values())


def once_per_slot(
    name: str,
    *,
    max_hold: float,
    min_hold: float = 0.0,
    using: str = DEFAULT_LOCK_ALIAS,
    skip_value: Any = None,
    on_lost: OnLost = "log",
) -> Callable[[F], F]:
    """Run the decorated job on one node per schedule slot; the others skip at once.

    Each call makes one non-blocking try for the lock ``name`` (one round trip on
    Redis; no waiting, no retry). The winner runs the function under a lease of
    ``max_hold`` seconds; afterwards, if less than ``min_hold`` seconds have passed
    since the grant, the lease is set to end ``min_hold`` after the grant instead
    of being released, else the lock is released. A loser returns ``skip_value``.
    The lock is kept for ``min_hold`` after a run that raised, too (the slot was
    used). Sync and async functions both work.

    :param name: the job's lock name (the same on every node; not a template).
    :param max_hold: the lease in seconds: the longest the job keeps the lock from
        the grant, so the time after which a crashed node's job can run again. As
        with :func:`~django_distlock.decorators.lock`'s ``max_hold``, an upper bound
        on holding; here there is no renewal, the lease itself is the bound.
    :param min_hold: the shortest time in seconds the lock is kept from the grant
        (default 0: released when the job returns). Choose it larger than the
        nodes' clock and schedule skew and smaller than the schedule's period.
    :param using: the ``DISTLOCK`` alias, looked up at each call.
    :param skip_value: what a call that lost the race returns.
    :param on_lost: when the lease turned out to have ended before the job returned
        (it ran longer than ``max_hold``, or the lock was force-released):
        ``"log"`` logs a warning and returns the result, ``"raise"`` raises
        :class:`~django_distlock.exceptions.LockLost`. When the job itself raised,
        its exception propagates and the loss is only logged.
    :returns: the decorator; the wrapper has ``job`` (:class:`ScheduledJob`).
    :raises TypeError, ValueError: when decorating, for a bad name, duration or
        ``on_lost``, or ``min_hold`` above ``max_hold``.
    :raises LeaseInTransaction: when called inside the caller's open transaction on an
        alias whose leases would be written in it (the database backend on SQLite),
        before anything is written.
    """
    validate_name(name)
    if not isinstance(using, str):
        raise TypeError("using must be a DISTLOCK alias (a str).")
    max_hold = _duration("max_hold", max_hold)
    if isinstance(min_hold, bool) or not isinstance(min_hold, int | float):
        raise TypeError(f"min_hold must be a number of seconds, not {type(min_hold).__name__}.")
    if not math.isfinite(min_hold) or min_hold < 0:
        raise ValueError(f"min_hold must be a finite number of seconds >= 0, got {min_hold!r}.")
    min_hold = float(min_hold)
    if min_hold > max_hold:
        raise ValueError(
            f"min_hold ({min_hold} s) is above max_hold ({max_hold} s): the lease would "
            "end before the lock was kept long enough."
        )
    if on_lost not in ("raise", "log"):
        raise ValueError(f"on_lost must be 'raise' or 'log', not {on_lost!r}.")

    def decorator(func: F) -> F:
        job = ScheduledJob(name, using, max_hold, min_hold, _describe(func))
        with _jobs_mutex:
            _jobs[(job.function, name, using)] = job
        label = f"scheduled job {name}"
        wrapper: Any

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                handle = _handle(job)
                backend = handle.backend
                # The thread whose connection the lease statements would use.
                if backend.leases_join_transaction and await sync_to_async(
                    backend.in_caller_transaction
                )():
                    raise _in_transaction(job, backend)
                context = enter(label)
                try:
                    won = await handle.aacquire(blocking=False)
                finally:
                    leave(context)
                if not won:
                    return skip_value
                try:
                    result = await func(*args, **kwargs)
                except BaseException:
                    await _afinish(handle, job, "log")  # never hides the job's exception
                    raise
                await _afinish(handle, job, on_lost)
                return result

        else:

            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                handle = _handle(job)
                if handle.backend.in_caller_transaction():
                    raise _in_transaction(job, handle.backend)
                context = enter(label)
                try:
                    won = handle.acquire(blocking=False)
                finally:
                    leave(context)
                if not won:
                    return skip_value
                try:
                    result = func(*args, **kwargs)
                except BaseException:
                    _finish(handle, job, "log")  # never hides the job's exception
                    raise
                _finish(handle, job, on_lost)
                return result

        wrapper.job = job
        return wrapper

    return decorator


def _duration(what: str, value: object) -> float:
    try:
        return validate_ttl(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(str(exc).replace("ttl must", f"{what} must", 1)) from None


def _describe(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def _handle(job: ScheduledJob) -> Lock:
    """A non-blocking handle whose lease is ``max_hold`` (never renewed)."""
    return locks[job.using].lock(job.name, ttl=job.max_hold, blocking=False, auto_renew=False)


def _in_transaction(job: ScheduledJob, backend: BaseLockBackend) -> LeaseInTransaction:
    """The refusal of a call whose lease the caller's transaction would take back."""
    return LeaseInTransaction(
        f"Scheduled job {job.name!r} ({job.function}) was called inside an open "
        f"transaction, and alias {job.using!r} ({type(backend).__name__}) would write its "
        "lock in that transaction: a rollback would undo the grant and the min_hold keep, "
        "and another firing would run the same slot. Nothing was written. Call the job "
        "outside transaction.atomic() (ATOMIC_REQUESTS included; in a test, a "
        "TransactionTestCase or django_db(transaction=True)), or lock on an alias whose "
        "leases live apart from your transaction (the database backend on PostgreSQL, "
        "Redis)."
    )


def _finish(handle: Lock, job: ScheduledJob, on_lost: OnLost) -> None:
    """After the run: keep the lock until ``min_hold`` after the grant, or release it."""
    keep = _keep_for(handle, job)
    try:
        if keep:  # the server's lease now ends min_hold after the grant
            handle.extend(keep)
        else:
            handle.release()
    except DistLockError as exc:
        _after(exc, handle, job, on_lost)


async def _afinish(handle: Lock, job: ScheduledJob, on_lost: OnLost) -> None:
    """Async :func:`_finish`."""
    keep = _keep_for(handle, job)
    try:
        if keep:
            await handle.aextend(keep)
        else:
            await handle.arelease()
    except DistLockError as exc:
        _after(exc, handle, job, on_lost)


def _keep_for(handle: Lock, job: ScheduledJob) -> float:
    """Seconds the lock must still be kept after the run (0: release it).

    Counted from the moment the grant reached this process, so the lock is kept
    at least ``min_hold`` after the server granted it. On a backend whose locks do
    not expire there is no lease to keep: release (``distlock.W040`` warned).
    """
    if not job.min_hold or not handle.backend.supports_expiry:
        return 0.0
    left = job.min_hold - (handle.held_for or 0.0)
    return left if left >= MIN_TTL else 0.0


def _after(exc: DistLockError, handle: Lock, job: ScheduledJob, on_lost: OnLost) -> None:
    """Keeping or releasing the lock after the run raised ``exc``."""
    hold_of(handle).stop_renewal()
    if isinstance(exc, LockLost):  # the lease ended first: another node may have run it
        if on_lost == "raise":
            raise exc
        logger.warning(
            "Scheduled job %r (%s) ran past its lease on alias %r (max_hold %s s): another "
            "node may have started it meanwhile (%s).", job.name, job.function, job.using,
            job.max_hold, exc,
        )
        return
    # The server failed: the lease still ends by itself, at most max_hold after the
    # grant, which only keeps the job from running longer than min_hold asked.
    logger.warning(
        "Scheduled job %r (%s): ending its lock on alias %r failed; its lease ends by "
        "itself at most max_hold (%s s) after the grant.", job.name, job.function,
        job.using, job.max_hold, exc_info=True,
    )


def check_jobs() -> list[Any]:
    """The system check of the decorated jobs (``distlock.E040``, ``distlock.W040``).

    A job on an alias that the setting's own checks already report (a malformed
    ``DISTLOCK``: E003; a missing ``"default"``: E001; a backend that cannot be
    built: E002/E003) adds no message of its own.

    :returns: Django check messages.
    """
    from django.conf import settings
    from django.core import checks

    from django_distlock.handler import LockHandler

    try:
        aliases = LockHandler.configure(getattr(settings, "DISTLOCK", None))
    except ImproperlyConfigured:
        return []
    backends: dict[str, BaseLockBackend | None] = {}
    messages: list[Any] = []
    for job in scheduled_jobs():
        if job.using not in aliases:
            if job.using != DEFAULT_LOCK_ALIAS:
                messages.append(
                    checks.Error(
                        f"Scheduled job {job.name!r} ({job.function}) locks on alias "
                        f"{job.using!r}, which DISTLOCK does not configure.",
                        hint="Pass using= an alias of the DISTLOCK setting.",
                        obj=job.function,
                        id="distlock.E040",
                    )
                )
            continue
        if job.using not in backends:
            try:
                backends[job.using] = locks.create_backend(job.using)
            except ImproperlyConfigured:
                backends[job.using] = None
        backend = backends[job.using]
        if backend is not None and job.min_hold and not backend.supports_expiry:
            messages.append(
                checks.Warning(
                    f"Scheduled job {job.name!r} ({job.function}) has min_hold="
                    f"{job.min_hold:g} on alias {job.using!r}, whose locks "
                    f"({type(backend).__name__}) do not expire: the lock cannot be kept "
                    "after the run, so it is released at once and a node whose clock or "
                    "schedule is late runs the same slot again (max_hold does not apply "
                    "either: a crashed holder frees the job at once).",
                    hint="Use an alias whose locks are leases (the database backend in "
                    "lease mode, Redis, Redlock, the cache backend), or set min_hold=0 "
                    "if the job may run twice in a slot.",
                    obj=job.function,
                    id="distlock.W040",
                )
            )
    return messages


def _check_jobs(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    return check_jobs()


def _register_check() -> None:
    """Register the jobs' check (idempotent: Django's registry is a set). At import, so
    that a site which decorates a job checks it, the app installed or not."""
    from django.core import checks

    checks.register(_check_jobs, "distlock")


_register_check()
