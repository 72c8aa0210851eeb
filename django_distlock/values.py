"""The values that lock handles and backends pass each other, and the checks of arguments."""

from __future__ import annotations

import functools
import hashlib
import math
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Final

from .context import SEPARATOR, clean
from .names import validate_name

#: ``sys.exc_info()``-shaped: the exception leaving a ``with`` block, or Nones.
ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]


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
#: Largest page :meth:`~django_distlock.backends.base.BaseLockBackend.held_locks` returns.
MAX_PAGE = 1000


#: What a number of seconds may be (a tuple: ``int | float`` builds a union per call).
_NUMBER = (int, float)


def validate_ttl(ttl: object) -> float:
    """Return ``ttl`` as float seconds, or raise ValueError/TypeError saying why not."""
    if isinstance(ttl, bool) or not isinstance(ttl, _NUMBER):
        raise TypeError(f"ttl must be a number of seconds, not {type(ttl).__name__}.")
    if not math.isfinite(ttl) or not MIN_TTL <= ttl <= MAX_TTL:
        raise ValueError(f"ttl must be between {MIN_TTL} and {MAX_TTL:.0f} seconds, got {ttl!r}.")
    return float(ttl)


def validate_timeout(timeout: object) -> float | None:
    """Return ``timeout`` as float seconds or None (wait forever), or raise saying why not.

    Any finite number of seconds is accepted; backends cap what they send to a
    server at what it takes and keep waiting until the deadline.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, _NUMBER):
        raise TypeError(
            f"timeout must be a number of seconds or None, not {type(timeout).__name__}."
        )
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}.")
    return None if math.isinf(timeout) else float(timeout)


def validate_page_args(
    prefix: object, limit: object, cursor: object
) -> tuple[str, int, str | None]:
    """Check the arguments of ``held_locks()`` before any I/O; raise TypeError/ValueError
    (:class:`~django_distlock.exceptions.InvalidLockName` for a bad prefix)."""
    if not isinstance(prefix, str):
        raise TypeError("prefix must be a str.")
    if prefix:
        validate_name(prefix)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError("limit must be an int.")
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}.")
    if cursor is not None:
        if not isinstance(cursor, str):
            raise TypeError("cursor must be a str returned as next_cursor, or None.")
        if any(unicodedata.category(char) in ("Cc", "Cs") for char in cursor):
            raise ValueError("cursor must be a next_cursor value returned by held_locks().")
    return prefix, limit, cursor


@dataclass(frozen=True, slots=True)
class Grant:
    """What a backend returns when it grants a lock."""

    #: Grows with every grant of the key; None when the backend issues none.
    fencing_token: int | None
    #: Server time of the grant, when the backend records it.
    acquired_at: datetime | None
    #: Server time the lease ends; None when the lock does not expire.
    expires_at: datetime | None
    #: Seconds the server spent, after it received the request, before it granted (a
    #: wait in the server). The handle counts the lease's local validity from the
    #: request's sending plus this, never from the start of the whole ``acquire()``.
    granted_after: float = 0.0


@dataclass(frozen=True, slots=True)
class Miss:
    """What a backend returns when the lock is held by someone else."""

    #: Seconds until the holder's lease ends on the server's clock, if known.
    retry_after: float | None = None


#: Longest stored holder field (thread label, separator, context): the database column's.
MAX_HOLDER = 255


@functools.lru_cache(maxsize=1024)  # per acquire, and the same few threads and contexts
def join_holder(thread: str, context: str) -> str:
    """The holder field a backend stores: the thread label, then the context (see
    :mod:`django_distlock.context`) after a separator neither can hold."""
    thread = clean(thread, 100)
    if not context:
        return thread
    return f"{thread}{SEPARATOR}{clean(context, MAX_HOLDER - len(thread) - 1)}"


def _split_holder(info: LockInfo | WaiterInfo) -> None:
    """Split a stored holder field passed as ``thread`` into ``thread`` and ``context``."""
    if SEPARATOR in info.thread:
        thread, _, context = info.thread.partition(SEPARATOR)
        object.__setattr__(info, "thread", thread)
        object.__setattr__(info, "context", info.context or context)


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One lock held right now, as listed by ``held_locks()``.

    Backends pass the stored holder field as ``thread``; it is split into ``thread``
    and ``context`` here.
    """

    alias: str
    #: The lock's name as given to ``lock()``; a name too long to store whole is shown
    #: shortened (see :func:`django_distlock.names.display_name`).
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
    #: ``"exclusive"``, or ``"read"``/``"write"`` for read-write locks (read: one of the
    #: readers that hold it is shown).
    kind: str = "exclusive"
    #: What the holder was doing: the request path or task name ``@distlock`` (or
    #: ``holder_context()``) recorded, or "".
    context: str = ""

    def __post_init__(self) -> None:
        _split_holder(self)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who acquired a handle's lock, as :attr:`Lock.holder <django_distlock.Lock.holder>`
    shows it (and as listings show other holders: :class:`LockInfo`)."""

    host: str
    #: None before the handle's first acquire.
    pid: int | None
    #: The thread's name, and the asyncio task's (``"thread/task"``).
    thread: str
    #: What the holder was doing (request path, task name; ``holder_context()``), or "".
    context: str


@dataclass(frozen=True, slots=True)
class LockOptions:
    """The options a handle was built with (``lock()``, ``read_lock()``, ``semaphore()``,
    the decorator), after the alias' defaults were applied; see :meth:`lock()
    <django_distlock.backends.base.BaseLockBackend.lock>` for each."""

    ttl: float
    timeout: float | None
    blocking: bool
    reentrant: bool
    auto_renew: bool
    max_hold: float | None
    #: How many holders a semaphore admits (None for other kinds).
    limit: int | None


#: Most waiters :meth:`~django_distlock.backends.base.BaseLockBackend.waiters` returns.
MAX_WAITERS = 1000


def validate_waiters_limit(limit: object) -> int:
    """Return ``limit`` of ``waiters()``, or raise TypeError/ValueError saying why not."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError("limit must be an int.")
    if not 1 <= limit <= MAX_WAITERS:
        raise ValueError(f"limit must be between 1 and {MAX_WAITERS}, got {limit}.")
    return limit


@dataclass(frozen=True, slots=True)
class WaiterInfo:
    """One client waiting for a lock, as listed by ``waiters()``, in its queue's order.

    What the backend does not store is left empty ("" or None): see the "Who waits"
    section of docs/admin-dashboard.md for what each backend knows.
    """

    #: 1 for the next in line, then 2, 3... (arrival order).
    position: int
    #: The short, non-secret id of the waiting acquisition's owner token, or "".
    owner: str
    #: Server time the waiter joined the queue, when the backend knows it.
    since: datetime | None
    host: str = ""
    pid: int | None = None
    #: The stored holder field of the waiter (thread label; split like
    #: :class:`LockInfo`'s into ``thread`` and ``context``).
    thread: str = ""
    #: ``"exclusive"``, ``"read"``, ``"write"``, ``"semaphore"``, or "" when unknown.
    kind: str = ""
    #: The waiter's handle on the server where that is all it shows: a PostgreSQL
    #: backend pid (``pg 4242``), a ZooKeeper node name; else "".
    session: str = ""
    context: str = ""

    def __post_init__(self) -> None:
        _split_holder(self)


@dataclass(frozen=True, slots=True)
class LockPage:
    """One page of held locks and the cursor of the next page (None on the last)."""

    locks: list[LockInfo]
    next_cursor: str | None

    def __iter__(self) -> Iterator[LockInfo]:
        return iter(self.locks)

    def __len__(self) -> int:
        return len(self.locks)


#: Length of the short owner id (:func:`short_owner`).
SHORT_OWNER = 8


def short_owner(token: str) -> str:
    """Return the non-secret id listings show for an owner token (32 of its 128 bits)."""
    return token[:SHORT_OWNER]


def validate_owner_id(owner: object) -> str:
    """Return ``owner``, a short owner id as listed in :attr:`LockInfo.owner` (None: ""),
    or raise TypeError/ValueError saying why it is not one."""
    if owner is None:
        return ""
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str or None, not {type(owner).__name__}.")
    if len(owner) != SHORT_OWNER or any(char not in "0123456789abcdef" for char in owner):
        raise ValueError(
            f"owner must be the {SHORT_OWNER}-hex-digit owner id a listing shows, got {owner!r}."
        )
    return owner


#: Longest accepted explicit ``owner=``.
MAX_OWNER = 200


def owner_token_of(owner: object) -> str:
    """Return the owner token that stands for an explicit ``owner=`` id: 32 hex
    digits, like the random tokens, so backends store one fixed width."""
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str, not {type(owner).__name__}.")
    if not 1 <= len(owner) <= MAX_OWNER:
        raise ValueError(f"owner must have 1 to {MAX_OWNER} characters.")
    try:
        validate_name(owner)
    except ValueError as exc:
        raise ValueError(f"owner: {str(exc).replace('A lock name', 'An owner')}") from exc
    return hashlib.sha256(b"django-distlock owner\x00" + owner.encode()).hexdigest()[:32]
