"""Retrying a read-modify-write that lost to another writer.

:func:`retry_on_conflict` re-calls a function, :func:`update_with_retry`
re-reads an instance and re-applies a change, on a version conflict or a
transaction the database refused (:func:`retryable`), with exponential
backoff and full jitter. See ``docs/optimistic.md``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ParamSpec, TypeVar, cast, overload

from asgiref.sync import sync_to_async
from django.db import OperationalError, connections

from django_distlock.backends.database.errors import transaction_refused
from django_distlock.backoff import Backoff
from django_distlock.exceptions import VersionConflict

from .mixin import OptimisticLockMixin, validate_update_fields

__all__ = ["retry_on_conflict", "retryable", "update_with_retry"]

logger = logging.getLogger("django_distlock")

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=OptimisticLockMixin)


def _check_retry_arguments(attempts: Any, base: Any, cap: Any) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        raise TypeError(f"attempts must be an int (calls in all), not {attempts!r}.")
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1 (calls in all), not {attempts}.")
    for name, value in (("base", base), ("cap", cap)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number of seconds, not {value!r}.")
        if not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, not {value!r}.")
    if cap < base:
        raise ValueError(f"cap ({cap}) must be >= base ({base}): cap bounds every wait.")


@overload
def retry_on_conflict(
    func: Callable[P, R], *, attempts: int = ..., base: float = ..., cap: float = ...
) -> Callable[P, R]: ...


@overload
def retry_on_conflict(
    func: None = None, *, attempts: int = ..., base: float = ..., cap: float = ...
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def retry_on_conflict(
    func: Callable[P, R] | None = None,
    *,
    attempts: int = 5,
    base: float = 0.005,
    cap: float = 0.25,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Re-call the decorated function when it raises :class:`VersionConflict`,
    or when the database refused its transaction (see :func:`retryable`).

    Usable bare (``@retry_on_conflict``) or with arguments. Waits between
    calls grow exponentially with full jitter. The function must re-read
    what it modifies on every call: a retry that saves the same stale
    instance conflicts again. Works on ``async def`` functions too (waits
    with :func:`asyncio.sleep`). Under REPEATABLE READ or SERIALIZABLE, open
    the transaction inside the function: a stale save there is refused by
    the database (a serialization failure, an ``OperationalError``) rather
    than by the version check, and is retried too; called inside an outer
    ``transaction.atomic()`` block, such a refusal is raised at once.

    :param func: the function, when used bare.
    :param attempts: calls in all (>= 1), the first included.
    :param base: first wait's upper bound, in seconds (> 0).
    :param cap: upper bound of every wait, in seconds (>= base).
    :returns: the wrapped function (or a decorator, when ``func`` is not given).
    :raises TypeError, ValueError: bad arguments, at decoration time.

    The wrapped function returns what ``func`` returns and raises the last
    :class:`VersionConflict` (or refusal) once ``attempts`` calls all
    conflicted; any other exception propagates at once.
    """
    _check_retry_arguments(attempts, base, cap)

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        if not callable(function):
            raise TypeError(
                f"retry_on_conflict() wraps a function, not {function!r}; give the other "
                "arguments by keyword: @retry_on_conflict(attempts=5)."
            )
        if inspect.iscoroutinefunction(function):
            return cast(Callable[P, R], _async_retrying(function, attempts, base, cap))

        @functools.wraps(function)
        def retrying(*args: P.args, **kwargs: P.kwargs) -> R:
            backoff = Backoff(base, cap)
            for attempt in range(1, attempts + 1):
                try:
                    return function(*args, **kwargs)
                except (VersionConflict, OperationalError) as exc:
                    if attempt == attempts or not retryable(exc):
                        raise
                    _log_retry(function, attempt, attempts, exc)
                time.sleep(backoff.next_delay())
            raise AssertionError("unreachable")  # pragma: no cover

        return retrying

    return decorate if func is None else decorate(func)


def _async_retrying(
    function: Callable[..., Awaitable[Any]], attempts: int, base: float, cap: float
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(function)
    async def retrying(*args: Any, **kwargs: Any) -> Any:
        backoff = Backoff(base, cap)
        for attempt in range(1, attempts + 1):
            try:
                return await function(*args, **kwargs)
            except (VersionConflict, OperationalError) as exc:
                if attempt == attempts or not await sync_to_async(retryable)(exc):
                    raise
                _log_retry(function, attempt, attempts, exc)
            await asyncio.sleep(backoff.next_delay())
        raise AssertionError("unreachable")  # pragma: no cover

    return retrying


#: SQLite's SQLITE_BUSY_SNAPSHOT: a DEFERRED transaction that read a snapshot
#: older than a commit made since cannot write (SQLite's serialization failure).
_SQLITE_BUSY_SNAPSHOT = 517


def retryable(exc: BaseException) -> bool:
    """Whether re-running the read-modify-write that raised ``exc`` can succeed.

    True for a :class:`VersionConflict`, and for a database's refusal of the
    whole transaction (a serialization failure under REPEATABLE READ or
    SERIALIZABLE, a deadlock, SQLite's ``SQLITE_BUSY_SNAPSHOT``) when no
    ``transaction.atomic()`` block is open on any connection of this thread:
    inside one, the transaction is already doomed, and only a retry of the
    whole block, outside it, can win.

    :param exc: the exception a save (or the transaction around it) raised.
    :returns: whether :func:`retry_on_conflict` and :func:`update_with_retry` retry it.
    """
    if isinstance(exc, VersionConflict):
        return True
    if not isinstance(exc, OperationalError):
        return False
    sqlite_code = getattr(exc.__cause__, "sqlite_errorcode", None)  # the driver's error
    if not transaction_refused(exc) and sqlite_code != _SQLITE_BUSY_SNAPSHOT:
        return False
    return not any(c.in_atomic_block for c in connections.all(initialized_only=True))


def _log_retry(what: Any, attempt: int, attempts: int, exc: Exception) -> None:
    name = getattr(what, "__qualname__", repr(what))
    what_happened = (
        "version conflict" if isinstance(exc, VersionConflict) else "refused by the database"
    )
    logger.debug("%s: %s, retry %d of %d: %s", name, what_happened, attempt, attempts - 1, exc)


def update_with_retry(
    instance: M,
    change: Callable[[M], object],
    *,
    attempts: int = 5,
    base: float = 0.005,
    cap: float = 0.25,
    update_fields: Iterable[str] | None = None,
) -> M:
    """Apply ``change`` to ``instance`` and save it, re-reading and re-applying on conflict.

    Each round calls ``change(instance)`` then
    ``instance.save(update_fields=update_fields)``; after a conflict it waits
    (exponential backoff, full jitter), reloads the instance with
    ``refresh_from_db()`` and goes again. ``change`` must decide from the
    instance's current values (e.g. raise when the stock is 0): it sees
    fresh values on every round.

    :param instance: an instance of an :class:`OptimisticLockMixin` model.
    :param change: a callable modifying the instance in place; what it
        returns is ignored. If it raises, nothing is saved and the exception
        propagates.
    :param attempts: rounds in all (>= 1).
    :param base: first wait's upper bound, in seconds (> 0).
    :param cap: upper bound of every wait, in seconds (>= base).
    :param update_fields: passed to ``save()``; None saves every field.
    :returns: ``instance``, saved, its version bumped.
    :raises VersionConflict: the last conflict, after ``attempts`` rounds.
    :raises OperationalError: the database refused the save's transaction (see
        :func:`retryable`): after ``attempts`` rounds, or at once inside an
        outer ``transaction.atomic()`` block.
    :raises ObjectDoesNotExist: the row was deleted meanwhile (from ``refresh_from_db``).
    :raises TypeError, ValueError: bad arguments; nothing is called or saved.
    """
    if not isinstance(instance, OptimisticLockMixin):
        raise TypeError(
            f"update_with_retry() needs an instance of a model using OptimisticLockMixin, "
            f"not {instance!r}."
        )
    if not callable(change):
        raise TypeError(f"change must be a callable taking the instance, not {change!r}.")
    _check_retry_arguments(attempts, base, cap)
    if update_fields is not None:
        if isinstance(update_fields, str):
            raise TypeError("update_fields must be a list of field names, not a string.")
        update_fields = list(update_fields)
        validate_update_fields(instance, frozenset(update_fields))
    backoff = Backoff(base, cap)
    for attempt in range(1, attempts + 1):
        change(instance)
        try:
            instance.save(update_fields=update_fields)
            return instance
        except (VersionConflict, OperationalError) as exc:
            if attempt == attempts or not retryable(exc):
                raise
            _log_retry(change, attempt, attempts, exc)
        time.sleep(backoff.next_delay())
        instance.refresh_from_db()
    raise AssertionError("unreachable")  # pragma: no cover
