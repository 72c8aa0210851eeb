"""The contract every lock backend implements, and the values it returns."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from django.core import checks

from ..backoff import Backoff
from ..exceptions import InvalidBackendOptions
from ..names import MAX_PREFIX_LENGTH, validate_name

if TYPE_CHECKING:
    from ..lease import Lock


class _Default:
    """Sentinel type: "use the alias' configured value"."""

    def __repr__(self) -> str:
        return "DEFAULT"


#: Pass for ``ttl``/``timeout`` to use the alias' ``TTL``/``TIMEOUT`` setting.
DEFAULT: Final = _Default()

#: Longest accepted lease, in seconds (30 days).
MAX_TTL = 30 * 24 * 3600.0
#: Shortest accepted lease, in seconds (the database clocks keep milliseconds).
MIN_TTL = 0.001
#: Largest page :meth:`BaseLockBackend.held_locks` returns.
MAX_PAGE = 1000

_PARAM_KEYS = frozenset({"BACKEND", "LOCATION", "OPTIONS", "KEY_PREFIX", "TTL", "TIMEOUT"})


def validate_ttl(ttl: object) -> float:
    """Return ``ttl`` as float seconds, or raise ValueError/TypeError saying why not."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise TypeError(f"ttl must be a number of seconds, not {type(ttl).__name__}.")
    if not math.isfinite(ttl) or not MIN_TTL <= ttl <= MAX_TTL:
        raise ValueError(f"ttl must be between {MIN_TTL} and {MAX_TTL:.0f} seconds, got {ttl!r}.")
    return float(ttl)


def validate_timeout(timeout: object) -> float | None:
    """Return ``timeout`` as float seconds or None (wait forever), or raise saying why not."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"timeout must be a number of seconds or None, not {type(timeout).__name__}."
        )
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}.")
    return None if math.isinf(timeout) else float(timeout)


@dataclass(frozen=True, slots=True)
class Grant:
    """What a backend returns when it grants a lock."""

    #: Grows with every grant of the key; None when the backend issues none.
    fencing_token: int | None
    #: Server time of the grant, when the backend records it.
    acquired_at: datetime | None
    #: Server time the lease ends; None when the lock does not expire.
    expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class Miss:
    """What a backend returns when the lock is held by someone else."""

    #: Seconds until the holder's lease ends on the server's clock, if known.
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One lock held right now, as listed by :meth:`BaseLockBackend.held_locks`."""

    alias: str
    name: str
    #: A short, non-secret id of the owner token (never the token itself).
    owner: str
    fencing_token: int | None
    acquired_at: datetime | None
    expires_at: datetime | None
    host: str
    pid: int | None
    thread: str
    #: Clients waiting for it, when the backend can tell; else None.
    waiters: int | None = None


@dataclass(frozen=True, slots=True)
class LockPage:
    """One page of held locks and the cursor of the next page (None on the last)."""

    locks: list[LockInfo]
    next_cursor: str | None

    def __iter__(self) -> Iterator[LockInfo]:
        return iter(self.locks)

    def __len__(self) -> int:
        return len(self.locks)


class Waiter:
    """Waits between acquisition attempts; this one sleeps with backoff and jitter.

    Backends that can be woken by the server return their own from
    :meth:`BaseLockBackend.waiter`. Used as a context manager around the
    retry loop, so a subscription is in place before the retry that follows
    the first miss.
    """

    def __init__(self) -> None:
        self.backoff = Backoff()

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def delay(self, miss: Miss, remaining: float | None) -> float:
        """Seconds to wait before the next attempt."""
        delay = self.backoff.next_delay(remaining)
        if miss.retry_after is not None:
            delay = min(delay, max(miss.retry_after, 0.0) + 0.001)
        return delay

    def wait(self, miss: Miss, remaining: float | None) -> None:
        """Block until the next attempt is worth making."""
        time.sleep(self.delay(miss, remaining))

    async def async_wait(self, miss: Miss, remaining: float | None) -> None:
        """Like :meth:`wait`, without blocking the event loop."""
        await asyncio.sleep(self.delay(miss, remaining))


class BaseLockBackend:
    """Base class of lock backends, built by the ``locks`` registry from one alias.

    :param alias: the key of this backend in the ``DISTLOCK`` setting.
    :param params: that alias' dict (``BACKEND``, ``OPTIONS``, ``KEY_PREFIX``,
        ``TTL``, ``TIMEOUT``, and ``LOCATION`` for server backends).
    :raises InvalidBackendOptions: when a value is unusable. ``__init__`` does
        no I/O, so system checks can build backends to validate settings.
    """

    #: Grants carry a fencing token that strictly increases with every grant of a key.
    supports_fencing: bool = True
    #: Locks are leases that end after their TTL on the server's clock.
    supports_expiry: bool = True
    #: :meth:`held_locks` can list the locks held now.
    supports_listing: bool = True
    #: :meth:`force_release` can free another owner's lock.
    supports_force_release: bool = True
    #: Waiters are woken by a server notification rather than by polling.
    wakes_waiters: bool = False

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        self.alias = alias
        unknown = set(params) - _PARAM_KEYS
        if unknown:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}] has unknown keys {sorted(unknown)}; "
                f"valid keys are {sorted(_PARAM_KEYS)}."
            )
        self.location = params.get("LOCATION")
        prefix = params.get("KEY_PREFIX", "")
        if not isinstance(prefix, str) or len(prefix) > MAX_PREFIX_LENGTH:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['KEY_PREFIX'] must be a str of at most "
                f"{MAX_PREFIX_LENGTH} characters."
            )
        if prefix:
            try:
                validate_name(prefix)
            except ValueError as exc:
                raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]['KEY_PREFIX']: {exc}") from exc
        self.key_prefix: str = prefix
        try:
            self.default_ttl: float = validate_ttl(params.get("TTL", 60))
            self.default_timeout: float | None = validate_timeout(params.get("TIMEOUT", 10))
        except (TypeError, ValueError) as exc:
            raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]: {exc}") from exc
        options = params.get("OPTIONS", {})
        if not isinstance(options, Mapping):
            raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]['OPTIONS'] must be a dict.")
        self.options: Mapping[str, Any] = options

    def __repr__(self) -> str:
        return f"<{type(self).__name__} alias={self.alias!r}>"

    # -- the public API ---------------------------------------------------

    def lock(
        self,
        name: str,
        *,
        ttl: float | _Default = DEFAULT,
        timeout: float | _Default | None = DEFAULT,
        blocking: bool = True,
    ) -> Lock:
        """Build a handle on the lock ``name``; no I/O happens until ``acquire()``.

        :param name: the lock's name; see :func:`django_distlock.names.validate_name`.
        :param ttl: lease length in seconds (default: the alias' ``TTL``).
        :param timeout: how long ``acquire()`` and ``with`` wait by default,
            in seconds; None waits forever (default: the alias' ``TIMEOUT``).
        :param blocking: whether ``acquire()`` and ``with`` wait at all by default.
        :raises InvalidLockName: for a bad name.
        :raises TypeError, ValueError: for a bad ``ttl`` or ``timeout``.
        """
        from ..lease import Lock

        key = self.make_key(name)
        ttl = self.default_ttl if isinstance(ttl, _Default) else validate_ttl(ttl)
        timeout = (
            self.default_timeout if isinstance(timeout, _Default) else validate_timeout(timeout)
        )
        if not isinstance(blocking, bool):
            raise TypeError("blocking must be True or False.")
        return Lock(self, name, key, ttl=ttl, timeout=timeout, blocking=blocking)

    def make_key(self, name: str) -> str:
        """Return the storage key of ``name``: the alias' ``KEY_PREFIX`` + the name."""
        return self.key_prefix + validate_name(name)

    def name_of(self, key: str) -> str:
        """Return the lock name of a storage key (the inverse of :meth:`make_key`)."""
        return key[len(self.key_prefix) :]

    def is_locked(self, name: str) -> bool:
        """Return whether anyone holds ``name`` now.

        :raises BackendUnavailable: when the server fails.
        """
        raise NotImplementedError

    def held_locks(
        self, prefix: str = "", limit: int = 50, cursor: str | None = None
    ) -> LockPage:
        """Return one page of the locks held now, in name order, whose name starts with
        ``prefix``; pass the page's ``next_cursor`` back for the next page.

        The cost grows with ``limit``, not with the number of locks held.

        :raises UnsupportedOperation: when ``supports_listing`` is False.
        :raises BackendUnavailable: when the server fails.
        """
        raise NotImplementedError

    def force_release(self, name: str) -> bool:
        """Free ``name`` whoever holds it; return whether a held lock was freed.

        The former holder finds out at its next ``extend()`` or ``release()``
        (:class:`~django_distlock.exceptions.LockLost`).

        :raises UnsupportedOperation: when ``supports_force_release`` is False.
        :raises BackendUnavailable: when the server fails.
        """
        raise NotImplementedError

    def health(self) -> float:
        """Make one round trip to the server and return its latency in seconds.

        :raises BackendUnavailable: when the server fails.
        """
        raise NotImplementedError

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Return system-check messages about this alias (no I/O)."""
        return []

    def close(self) -> None:
        """Release the connections and threads this backend holds in this process."""
        return None

    # -- the primitives a Lock handle calls -------------------------------

    def try_acquire(self, lock: Lock, token: str, wait: float | None) -> Grant | Miss:
        """Make one attempt to grant ``lock`` to ``token``.

        :param wait: 0 for a non-blocking attempt; otherwise the seconds left to
            wait (None: forever), which backends that wait in the server use.
        :raises BackendUnavailable: when the server fails.
        """
        raise NotImplementedError

    def release_lock(self, lock: Lock, token: str, exc_info: tuple[Any, Any, Any]) -> bool:
        """Release ``lock`` if ``token`` holds it; return False if it does not.

        :param exc_info: the exception leaving a ``with`` block, or Nones.
        :raises BackendUnavailable: when the server fails.
        """
        raise NotImplementedError

    def extend_lock(self, lock: Lock, token: str, ttl: float) -> Grant | None:
        """Make ``token``'s lease end ``ttl`` seconds from now; None if it no longer holds it.

        :raises BackendUnavailable: when the server fails.
        """
        raise NotImplementedError

    def waiter(self, lock: Lock) -> Waiter:
        """Return the :class:`Waiter` a blocking ``acquire()`` uses between attempts."""
        return Waiter()


def validate_page_args(
    prefix: object, limit: object, cursor: object
) -> tuple[str, int, str | None]:
    """Check the arguments of ``held_locks()``; raise TypeError/ValueError saying why."""
    if not isinstance(prefix, str):
        raise TypeError("prefix must be a str.")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError("limit must be an int.")
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}.")
    if cursor is not None and not isinstance(cursor, str):
        raise TypeError("cursor must be a str returned as next_cursor, or None.")
    return prefix, limit, cursor
