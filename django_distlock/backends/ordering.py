"""Listing held locks by age: :meth:`AgeOrderMixin.held_locks_by_age` and its hook.

A backend offers it (``supports_age_order``) only where an index of its server gives the
order, so that a page costs what a page of :meth:`~.base.BaseLockBackend.held_locks`
costs: the database's
lease mode (the lock table's indexes on ``(acquired_at, name)`` and ``(expires_at,
name)`` over the held rows). Redis' listing index is ordered by name, ZooKeeper keeps a
lock's age in its node's stat (one read per lock), and a transaction-mode lock is a row
locked by an open transaction: for those, an order by age would read every lock held,
so they do not offer it (the admin says so beside the merged view).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..names import listed_under, stored_prefix
from ..values import LockInfo, validate_page_args

if TYPE_CHECKING:
    from ..circuit import Circuit

#: The orders: held longest first (``acquired``), expiring soonest first (``expires``).
AGE_ORDERS = ("acquired", "expires")


@dataclass(frozen=True, slots=True)
class OrderedPage:
    """One page of held locks in an age order, with a cursor after each of them."""

    locks: list[LockInfo]
    #: ``cursors[i]`` continues the listing after ``locks[i]`` (a merge of several
    #: aliases' pages stops anywhere in a page).
    cursors: list[str]
    #: False: the listing ended with this page.
    more: bool


def make_cursor(at: str, key: str) -> str:
    """The cursor after the row of ``key`` whose order column reads ``at`` (as stored)."""
    return json.dumps([at, key], separators=(",", ":"))


def read_cursor(cursor: str) -> tuple[str, str]:
    """The (order column as stored, key) a cursor of :func:`make_cursor` carries.

    :raises ValueError: for a value that is not one.
    """
    try:
        at, key = json.loads(cursor)
    except (ValueError, TypeError) as exc:
        raise ValueError("cursor must be a cursor returned by held_locks_by_age().") from exc
    if not isinstance(at, str) or not isinstance(key, str):
        raise ValueError("cursor must be a cursor returned by held_locks_by_age().")
    return at, key


class AgeOrderMixin:
    """The age-ordered listing of :class:`~django_distlock.backends.base.BaseLockBackend`
    and its hook."""

    #: :meth:`held_locks_by_age` pages through the held locks by age, each page costing
    #: what a page of ``held_locks()`` does (the backend implements
    #: :meth:`_held_locks_by_age`).
    supports_age_order: ClassVar[bool] = False
    alias: str
    circuit: Circuit

    if TYPE_CHECKING:

        def refuse_unless(self, flag: str, doing: str) -> None: ...

    def held_locks_by_age(
        self, order: str, prefix: str = "", limit: int = 50, cursor: str | None = None
    ) -> OrderedPage:
        """Return one page of the locks held now, held longest first (``order``
        ``"acquired"``) or expiring soonest first (``"expires"``), ties in key order.

        Without a ``prefix`` the cost grows with ``limit``, not with the locks held.
        With one, the page also reads past the held locks outside it that come earlier
        in the order. Held longest first also reads past leases that ended without a
        release (until their holder's name is taken again or pruned).

        :param order: ``"acquired"`` or ``"expires"``.
        :param prefix: the start of the names listed ("": all).
        :param limit: the most locks on the page, from 1 to 1,000.
        :param cursor: one of a previous page's ``cursors`` (None: the first page).
        :returns: the page.
        :raises UnsupportedOperation: when ``supports_age_order`` is False.
        :raises TypeError, ValueError: for bad arguments (before any I/O).
        :raises BackendUnavailable: when the server fails, or at once while the
            alias' circuit is open (``FAIL_FAST``).
        """
        prefix, limit, cursor = validate_page_args(prefix, limit, cursor)
        if order not in AGE_ORDERS:
            raise ValueError(f"order must be one of {AGE_ORDERS}, got {order!r}.")
        after = read_cursor(cursor) if cursor is not None else None
        self.refuse_unless("supports_age_order", "list held locks by age")
        matched = stored_prefix(prefix)
        page = self.circuit.call(
            "list held locks", self._held_locks_by_age, order, matched, limit, after
        )
        if matched == prefix:
            return page
        # Longer than a long name's stored head (see held_locks()): matched here.
        kept = [i for i, info in enumerate(page.locks) if listed_under(info.name, prefix)]
        return OrderedPage(
            [page.locks[i] for i in kept], [page.cursors[i] for i in kept], page.more
        )

    def _held_locks_by_age(
        self, order: str, prefix: str, limit: int, after: tuple[str, str] | None
    ) -> OrderedPage:
        """The backend's ordered listing behind :meth:`held_locks_by_age` (where
        ``supports_age_order``): the arguments are checked already; ``after`` is the
        (order column as stored, key) of the last row read."""
        raise NotImplementedError  # never called: see BaseLockBackend._check_implementation()
