"""Lease mode's listing by age (``supports_age_order``, :mod:`..ordering`): one statement
per page, an index range scan of the lock table's ``distlock_held_acquired_idx`` or
``distlock_held_expires_idx`` (over the held rows, ``owner IS NOT NULL``; on MySQL, of
a generated column NULL while the row is free) from the cursor on, so a page reads
about as many rows as it shows."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..base import OrderedPage, make_cursor
from .mysql_sql import BY_AGE as _MYSQL
from .sql import _COLUMNS, _NOW, TABLE, upper_bound

if TYPE_CHECKING:
    from .lease import LeaseBackend

# Params: lower (prefix), upper, the cursor's time and key, limit. SQLite: ``+name``
# keeps its planner off the name index (the alias' KEY_PREFIX is a range of it, which it
# would take, then sort every held row). The order column
# comes from AGE_ORDERS (never from the request). Ties are in the index's (the
# database's) collation of the name, the cursor's comparison too.
_PG = f"""
SELECT {_COLUMNS} FROM {TABLE}
WHERE owner IS NOT NULL AND expires_at > now()
  AND (name COLLATE "C") >= %s AND (name COLLATE "C") < %s
  AND ({{column}}, name) > (%s::timestamptz, %s)
ORDER BY {{column}}, name LIMIT %s"""
_SQLITE = f"""
SELECT {_COLUMNS} FROM {TABLE}
WHERE owner IS NOT NULL AND expires_at > {_NOW}
  AND +name >= %s AND +name < %s AND ({{column}}, name) > (%s, %s)
ORDER BY {{column}}, name LIMIT %s"""
_COLUMN = {"acquired": "acquired_at", "expires": "expires_at"}
#: Where the first page starts: before every time (as each vendor compares it).
_START = {"postgresql": "-infinity", "sqlite": "", "mysql": "0001-01-01 00:00:00"}
_STATEMENTS = {"postgresql": _PG, "sqlite": _SQLITE, "mysql": _MYSQL}


def age_statement(vendor: str, order: str) -> str:
    """The statement of one page in ``order`` on ``vendor``. Params: lower (prefix), upper,
    the cursor's time (as stored) and key, limit.

    :param vendor: ``"postgresql"``, ``"sqlite"`` or ``"mysql"``.
    :param order: ``"acquired"`` or ``"expires"``.
    :returns: the SQL.
    """
    return _STATEMENTS[vendor].format(column=_COLUMN[order])


def _stored(value: Any, vendor: str) -> str:
    """A time column's value as the database compares it back: PostgreSQL parses an ISO
    time, MySQL its own text to the microsecond; SQLite compares the text its statements
    write (``strftime``'s ``%f``: to the millisecond), which Django's driver hands over
    as a datetime."""
    if not isinstance(value, datetime):
        return str(value)
    if vendor == "postgresql":
        return value.isoformat()
    if vendor == "mysql":  # DATETIME(6), naive UTC
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}"


def held_by_age(
    backend: LeaseBackend, order: str, prefix: str, limit: int, after: tuple[str, str] | None
) -> OrderedPage:
    """One page of ``backend``'s held locks in ``order`` (checked arguments).

    :param backend: a lease-mode backend.
    :param order: ``"acquired"`` or ``"expires"``.
    :param prefix: the start of the names (stored form).
    :param limit: the most rows.
    :param after: the (time as stored, key) of the last row read, None from the start.
    :returns: the page.
    :raises BackendUnavailable: when the database fails.
    """
    low = backend.key_prefix + prefix
    at, key = after if after is not None else (_START.get(backend.vendor, ""), "")
    params = [low, upper_bound(low), at, key, limit]
    if backend.vendor == "mysql":  # its range starts at the cursor's time: given twice
        params.insert(2, at)
    rows = backend.run(age_statement(backend.vendor, order), params, "listing locks by age")
    index = 3 if order == "acquired" else 4  # the column's place in _COLUMNS
    cursors = {row[0]: make_cursor(_stored(row[index], backend.vendor), row[0]) for row in rows}
    shown = backend.page_infos(rows)
    return OrderedPage(
        [info for _, info in shown], [cursors[key] for key, _ in shown], len(rows) == limit
    )
