"""One page of held locks across aliases in an age order: a k-way merge of per-alias pages.

Each alias whose backend can order by age cheaply (``supports_age_order``: the
database's lease mode) gives its next ``limit`` locks in that order from its own
cursor (one indexed read); the page is the first ``limit`` of their merge, and its
position is each alias' cursor after the last of its locks the page showed. So a page
costs one read of ``limit`` rows per alias, whatever the number of locks held. The
aliases that list but cannot order by age cheaply are left out of the merge, each with
its reason (:func:`order_reason`), never mixed in out of order.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.core import signing

from django_distlock.backends.base import AGE_ORDERS, BaseLockBackend
from django_distlock.exceptions import DistLockError, UnsupportedOperation
from django_distlock.handler import locks
from django_distlock.values import LockInfo, validate_page_args

from .listing import AliasState, BadPosition, Row, alias_states, lock_kind

#: A merged page's position: each merged alias' cursor (None: from its start; DONE: read
#: to its end).
MergedPosition = dict[str, "str | int | None"]
DONE = 0
MERGED_SALT = "django_distlock.dashboard.merged"
#: The most earlier positions a merged page's "Previous page" link carries.
MAX_MERGED_TRAIL = 10
_LAST = datetime.max.replace(tzinfo=UTC)

#: Why a kind of backend is left out of the order by age, by class name.
_WHY_NOT = {
    "RedisBackend": "its listing index is a sorted set in name order; an order by age "
    "would read every lock held",
    "RedlockBackend": "its listing index is a sorted set in name order on each master; an "
    "order by age would read every lock held",
    "ZooKeeperBackend": "a lock's age is in its node's stat, one read per lock; an order by "
    "age would read every lock held",
    "LocMemBackend": "its locks are in this process only; it keeps no order by age",
}


def order_reason(backend: BaseLockBackend) -> str:
    """Why ``backend``'s locks are not in the merged order by age ("" when they are).

    :param backend: an alias' backend that lists its locks.
    :returns: the reason, or "".
    """
    if backend.supports_age_order:
        return ""
    if getattr(backend, "mode", None) == "transaction":
        return ("a lock held in transaction mode is a row locked by an open transaction; "
                "only a scan of every row finds which")
    return _WHY_NOT.get(type(backend).__name__, "its backend offers no listing by age")


@dataclass(slots=True)
class MergedPage:
    rows: list[Row] = field(default_factory=list)
    next_position: MergedPosition | None = None
    aliases: list[AliasState] = field(default_factory=list)
    #: The aliases that list but are left out of the order: (alias, label, reason).
    left_out: list[tuple[str, str, str]] = field(default_factory=list)


def _when(info: LockInfo, order: str) -> datetime:
    at = info.acquired_at if order == "acquired" else info.expires_at
    return at or _LAST


def read_merged(
    aliases: Sequence[str],
    prefix: str,
    order: str,
    limit: int,
    position: MergedPosition | None = None,
) -> MergedPage:
    """Return up to ``limit`` held locks of ``aliases`` in ``order`` (``"acquired"``:
    held longest first; ``"expires"``: expiring soonest first), from ``position``
    (None: the start). Ties: the aliases' configured order, then each alias' own.

    :param aliases: the aliases to merge (those that cannot are in ``left_out``).
    :param prefix: the start of the names ("": all).
    :param order: ``"acquired"`` or ``"expires"``.
    :param limit: the most locks on the page.
    :param position: a previous page's ``next_position``.
    :returns: the page; ``next_position`` None on the last.
    :raises BadPosition: for a position that names an alias not merged here.
    """
    validate_page_args(prefix, limit, None)
    if order not in AGE_ORDERS:
        raise ValueError(f"order must be one of {AGE_ORDERS}, got {order!r}.")
    states = alias_states(aliases)
    page = MergedPage(aliases=list(states.values()))
    merged: list[str] = []
    for alias in aliases:
        state = states[alias]
        if not state.listing or state.error:
            continue
        reason = order_reason(locks[alias])
        if reason:
            page.left_out.append((alias, state.label, reason))
        else:
            merged.append(alias)
    cursors: MergedPosition = dict.fromkeys(merged)
    if position is not None:
        if set(position) != set(merged):
            raise BadPosition("This page link was made for other aliases; start from the "
                              "first page.")
        cursors.update(position)
    runs: list[list[tuple[datetime, int, int, Row, str]]] = []
    more: dict[str, bool] = {}
    for number, alias in enumerate(merged):
        cursor = cursors[alias]
        if cursor == DONE:
            continue
        state, backend = states[alias], locks[alias]
        try:
            found = backend.held_locks_by_age(
                order, prefix, limit, cursor if isinstance(cursor, str) else None
            )
        except (DistLockError, UnsupportedOperation) as exc:
            state.error = str(exc) or type(exc).__name__
            continue  # its cursor stays: the next page reads on from there
        except ValueError as exc:  # a cursor the backend rejects
            raise BadPosition(str(exc)) from exc
        kind, release = lock_kind(backend), backend.supports_force_release
        more[alias] = found.more
        run, floor = [], datetime.min.replace(tzinfo=UTC)
        for i, info in enumerate(found.locks):
            # The readers or permits of a name come at its row's place (their own times
            # may be later): the run stays in order for the merge.
            floor = max(floor, _when(info, order))
            row = Row(info, state.backend_type, kind, release, state.label)
            run.append((floor, number, i, row, found.cursors[i]))
        runs.append(run)
        if not found.locks and not found.more:
            cursors[alias] = DONE
    taken: dict[str, int] = {}
    for _, number, _, row, cursor in heapq.merge(*runs):
        if len(page.rows) >= limit:
            break
        page.rows.append(row)
        alias = merged[number]
        cursors[alias] = cursor
        taken[alias] = taken.get(alias, 0) + 1
    for run in runs:
        if run:
            alias = merged[run[0][1]]
            if taken.get(alias, 0) == len(run) and not more[alias]:
                cursors[alias] = DONE
    if any(cursor != DONE for cursor in cursors.values()):
        page.next_position = cursors
    return page


def sign_merged(positions: Sequence[MergedPosition | None], query: Sequence[str]) -> str:
    """Return the URL value of merged page positions (one: a page; several: the trail of
    the pages before, the newest last, the oldest beyond :data:`MAX_MERGED_TRAIL`
    dropped), bound to the page's query (alias filter, prefix, order)."""
    kept: list[Any] = list(positions[-MAX_MERGED_TRAIL:])
    return signing.dumps([kept, *query], salt=MERGED_SALT, compress=True)


def unsign_merged(value: str, query: Sequence[str]) -> list[MergedPosition | None]:
    """Return the positions a URL value of :func:`sign_merged` carries; raise BadPosition
    for one we did not make for this query."""
    try:
        kept, *made_for = signing.loads(value, salt=MERGED_SALT)
        positions: list[MergedPosition | None] = [
            None if p is None else {str(a): (c if c is None or c == DONE else str(c))
                                    for a, c in dict(p).items()}
            for p in kept
        ]
    except (signing.BadSignature, ValueError, TypeError, AttributeError) as exc:
        raise BadPosition("This page link is not valid; start from the first page.") from exc
    if made_for != list(query):
        raise BadPosition("This page link belongs to another filter; start from the first page.")
    return positions
