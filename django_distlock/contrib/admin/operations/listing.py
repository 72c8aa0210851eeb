"""One page of held locks across every alias that can list, by the backends' cursors.

A page position is ``(alias, backend cursor)``: a page reads the aliases in
their configured order from that position, asking each backend for only the
rows still missing, so its cost grows with the page size (and the number of
aliases), never with the number of locks held; it makes at most
:data:`READS_PER_PAGE` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.core import signing

from django_distlock.backends.base import BaseLockBackend
from django_distlock.exceptions import DistLockError, LockConfigurationError, UnsupportedOperation
from django_distlock.handler import locks
from django_distlock.values import LockInfo, validate_page_args

CURSOR_SALT = "django_distlock.dashboard.cursor"
#: Most ``held_locks()`` calls one page makes. A page that reaches it ends short, with the
#: position to read on from, so that a backend full of names no longer held (transaction
#: mode) costs each page view a bounded amount of work.
READS_PER_PAGE = 20


class BadPosition(ValueError):
    """A page cursor from the URL that was tampered with, or made for another query."""


@dataclass(frozen=True, slots=True)
class Row:
    """A held lock with what the table shows about its backend."""

    info: LockInfo
    backend_type: str
    kind: str
    can_release: bool
    #: The backend as an operator names it ("PostgreSQL (lease)"): :func:`backend_label`.
    label: str = ""


@dataclass(slots=True)
class AliasState:
    """How one alias fared: listed, cannot list, or failed with a reason."""

    alias: str
    backend_type: str
    listing: bool
    error: str = ""
    #: Why the backend cannot list (its ``why_unsupported``), where ``listing`` is False.
    reason: str = ""
    #: The backend as an operator names it: :func:`backend_label`.
    label: str = ""


@dataclass(slots=True)
class Page:
    rows: list[Row] = field(default_factory=list)
    next_position: tuple[str, str | None] | None = None
    aliases: list[AliasState] = field(default_factory=list)


def backend_type(backend: BaseLockBackend) -> str:
    return type(backend).__name__


_LABELS = {
    "RedisBackend": "Redis",
    "UnlistedRedisBackend": "Redis",
    "RedlockBackend": "Redlock",
    "ZooKeeperBackend": "ZooKeeper",
    "CacheBackend": "Django cache",
    "LocMemBackend": "locmem (this process)",
}


def backend_label(backend: BaseLockBackend) -> str:
    """Return the backend as an operator names it: "PostgreSQL (lease)", "SQLite
    (transaction)", "Redis", "Redis Cluster", "Redlock", "ZooKeeper", "locmem (this
    process)"; a backend of another package: its class name (no I/O).

    :param backend: the alias' backend.
    :returns: the label.
    """
    name = type(backend).__name__
    mode = getattr(backend, "mode", None)
    if isinstance(mode, str) and hasattr(backend, "database"):
        try:
            vendor = str(backend.vendor_name)  # type: ignore[attr-defined]
        except Exception:  # DATABASES lacks the alias: the listing reports it
            vendor = ""
        return f"{vendor or 'database'} ({mode})"
    label = _LABELS.get(name, name)
    if label == "Redis" and getattr(getattr(backend, "redis", None), "cluster", False):
        return "Redis Cluster"
    return label


def lock_kind(backend: BaseLockBackend) -> str:
    """Return the lock kind: lease (expires), transaction, or session (no expiry)."""
    mode = getattr(backend, "mode", None)
    if isinstance(mode, str):
        return mode
    return "lease" if backend.supports_expiry else "session"


def alias_states(aliases: Sequence[str]) -> dict[str, AliasState]:
    """Build each alias' backend (no I/O); an alias that won't build is an error state."""
    states: dict[str, AliasState] = {}
    for alias in aliases:
        try:
            backend = locks[alias]
        except LockConfigurationError as exc:
            states[alias] = AliasState(alias, "?", False, f"misconfigured: {exc}")
            continue
        reason = "" if backend.supports_listing else backend.why_unsupported.get(
            "supports_listing", "")
        states[alias] = AliasState(alias, backend_type(backend), backend.supports_listing,
                                   reason=reason, label=backend_label(backend))
    return states


def read_page(
    aliases: Sequence[str],
    prefix: str,
    limit: int,
    position: tuple[str, str | None] | None = None,
) -> Page:
    """Return up to ``limit`` held locks from ``position`` (None: the start).

    The page is shorter only at the end (``next_position`` None), or when it made
    :data:`READS_PER_PAGE` reads (``next_position`` set). An alias whose server fails
    is reported in ``Page.aliases`` and skipped.
    """
    validate_page_args(prefix, limit, None)
    states = alias_states(aliases)
    page = _read_page(aliases, states, prefix, limit, position)
    if page.next_position is not None and _ends_here(list(aliases), states,
                                                     page.next_position, prefix):
        page.next_position = None  # no link to an empty page
    return page


def _read_page(aliases: Sequence[str], states: dict[str, AliasState], prefix: str, limit: int,
               position: tuple[str, str | None] | None) -> Page:
    """:func:`read_page`'s rows and where the next page starts."""
    page = Page(aliases=list(states.values()))
    order = list(aliases)
    start, cursor = 0, None
    if position is not None:
        if position[0] not in states:
            raise BadPosition(f"The alias {position[0]!r} of this cursor is not listed.")
        start, cursor = order.index(position[0]), position[1]
    reads = 0
    for index in range(start, len(order)):
        state = states[order[index]]
        if not state.listing or state.error:
            cursor = None
            continue
        backend = locks[state.alias]
        kind, release = lock_kind(backend), backend.supports_force_release
        # A short page with a cursor is not the end of the alias: a backend may read past
        # names no longer held (transaction mode keeps released names' rows, Redis its
        # expired index entries), so read on in this alias until it gives no cursor.
        while True:
            if reads >= READS_PER_PAGE:
                page.next_position = (state.alias, cursor)
                return page
            missing = limit - len(page.rows)
            reads += 1
            try:
                found = backend.held_locks(prefix=prefix, limit=missing, cursor=cursor)
            except (DistLockError, UnsupportedOperation) as exc:
                state.error = str(exc) or type(exc).__name__
                break
            except ValueError as exc:  # a cursor the backend rejects
                raise BadPosition(str(exc)) from exc
            page.rows.extend(
                Row(info, state.backend_type, kind, release, state.label) for info in found
            )
            cursor = found.next_cursor
            if cursor is None:
                break
            if len(page.rows) >= limit:
                page.next_position = (state.alias, cursor)
                return page
        cursor = None
        if len(page.rows) >= limit:
            if index + 1 < len(order):
                page.next_position = (order[index + 1], None)
            return page
    return page


def _ends_here(order: list[str], states: dict[str, AliasState], position: tuple[str, str | None],
               prefix: str) -> bool:
    """Whether nothing is held from ``position`` on: a backend gives a cursor whenever it
    filled the page it was asked for, so a full page may be the last. One read of one
    row per alias looked at, until a row is found; an alias that fails counts as more."""
    start, cursor = order.index(position[0]), position[1]
    for alias in order[start:]:
        state = states[alias]
        if state.listing and not state.error:
            try:
                found = locks[alias].held_locks(prefix=prefix, limit=1, cursor=cursor)
            except (DistLockError, UnsupportedOperation):
                return False
            if len(found) or found.next_cursor is not None:
                return False
        cursor = None
    return True


def find_lock(alias: str, name: str) -> LockInfo | None:
    """Return the lock ``name`` of ``alias`` if held now (one page of one row).

    :raises DistLockError: when the backend fails or cannot list.
    """
    # Key order puts ``name`` first among the names that start with it.
    for info in locks[alias].held_locks(prefix=name, limit=1):
        if info.name == name:
            return info
    return None


def sign_position(position: tuple[str, str | None], query: tuple[str, str]) -> str:
    """Return the URL value of a page position, bound to the page's (alias filter, prefix)."""
    return signing.dumps([position[0], position[1], *query], salt=CURSOR_SALT, compress=True)


def unsign_position(value: str, query: tuple[str, str]) -> tuple[str, str | None]:
    """Return the page position a URL carries; raise BadPosition if it is not one we made."""
    try:
        alias, cursor, *made_for = signing.loads(value, salt=CURSOR_SALT)
    except (signing.BadSignature, ValueError, TypeError) as exc:
        raise BadPosition("This page link is not valid; start from the first page.") from exc
    if made_for != list(query):
        raise BadPosition("This page link belongs to another filter; start from the first page.")
    return alias, cursor


TRAIL_SALT = "django_distlock.dashboard.trail"
#: The most earlier page positions a "Previous page" link carries (older: "First page").
MAX_TRAIL = 20
Position = tuple[str, str | None]


def sign_trail(trail: Sequence[Position | None], query: tuple[str, str]) -> str:
    """Return the URL value of the positions of the pages before this one (None: the first
    page), the newest last, bound to the page's (alias filter, prefix); the oldest beyond
    :data:`MAX_TRAIL` are dropped."""
    kept = [list(position) if position else None for position in trail[-MAX_TRAIL:]]
    return signing.dumps([kept, *query], salt=TRAIL_SALT, compress=True)


def unsign_trail(value: str, query: tuple[str, str]) -> list[Position | None]:
    """Return the positions a ``back`` URL value carries; raise BadPosition if it is not one
    we made for this query."""
    try:
        kept, *made_for = signing.loads(value, salt=TRAIL_SALT)
        trail: list[Position | None] = [
            (str(p[0]), None if p[1] is None else str(p[1])) if p else None for p in kept
        ]
    except (signing.BadSignature, ValueError, TypeError, IndexError) as exc:
        raise BadPosition("This page link is not valid; start from the first page.") from exc
    if made_for != list(query):
        raise BadPosition("This page link belongs to another filter; start from the first page.")
    return trail
