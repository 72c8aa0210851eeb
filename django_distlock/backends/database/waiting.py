"""Who waits for a lease-mode lock on PostgreSQL, read from the server's own queues
(MySQL: from the rows its waiters write, sql/mysql.sql).

A waiter queues in the server (docs/database.md): on the name's *queue* advisory
lock (``hashtextextended(name, 0)``) for ``lock(name)``, on its kinds queue
(``hashtextextended(name, -3)``) for read and write locks and permits. What
identifies a waiter honestly:

- the exclusive queue's **head** has reserved the lock in the row (``next_owner``,
  ``next_host``, ``next_pid``, ``next_thread``) and holds its *alive* lock
  (``hashtextextended(owner, -2)``) on its session: listed with its owner id,
  host, process and thread, since its ``CALL``'s start on the server's clock;
- the kinds queue's head holds that queue's advisory lock on a session that sits
  idle between its looks at the row;
- everyone **behind** a head sleeps in ``pg_advisory_lock``: ``pg_locks`` lists it
  ungranted with ``waitstart`` (the server's time it began to wait, PostgreSQL 14+),
  which gives the order. A ``lock(name)`` waiter's client identity is not in the
  server: it is shown by its server session (backend pid) and client address;
- a reader, writer or permit records itself before it joins the kinds queue (one row
  per server session, sql/postgresql.sql: kind, since, owner id, host, process, thread),
  and is listed with them while its session waits in, or heads, that queue (a row of
  a session that no longer does, or of an earlier session with the same pid, shows
  nothing). One without a row (its enqueue's connection was lost and the join ran on
  a new one) is shown by its session, its kind empty.

An asyncio task waiting for a free session of the pool, or a thread between two
attempts, is not in a queue yet and is not shown.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ...values import WaiterInfo, short_owner
from .mysql_sql import WAITER_COUNTS
from .mysql_sql import WAITERS as MYSQL_WAITERS
from .sql import _RESERVED, TABLE, as_datetime

if TYPE_CHECKING:
    from .lease import LeaseBackend

# The advisory locks of a 64-bit key, as pg_locks shows them (one scan of the lock
# table per statement: MATERIALIZED).
_ADVISORY = """advisory AS MATERIALIZED (
    SELECT (classid::bigint << 32) | objid::bigint AS lock, granted, pid, waitstart
    FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1)"""


def _as_lock(key_sql: str) -> str:
    """SQL: the pg_locks form (unsigned halves joined) of the advisory key ``key_sql``."""
    return f"((({key_sql}) >> 32) & 4294967295) << 32 | (({key_sql}) & 4294967295)"


#: The kinds queue's waiters as they recorded themselves before joining (sql/postgresql.sql):
#: only the row of the session that waits or heads now (its session started when the
#: row says: a pid reused by a later session does not match).
_RECORDED = """LEFT JOIN django_distlock_share_waiter w ON w.session = a.pid
        AND w.name = %(key)s AND w.started = s.backend_start"""

#: Params: key, limit. Rows: (queue, owner, host, pid, thread, since, session pid, kind),
#: the exclusive queue first (its head, then by waitstart), then the kinds queue (its
#: head, then by waitstart).
WAITERS = f"""
WITH {_ADVISORY},
head AS (
    SELECT next_owner, next_host, next_pid, next_thread FROM {TABLE}
    WHERE name = %(key)s AND next_owner IS NOT NULL AND {_RESERVED}
),
found AS (
    SELECT 0 AS part, h.next_owner AS owner, h.next_host AS host, h.next_pid AS pid,
        h.next_thread AS thread, s.query_start AS since, a.pid AS session,
        'exclusive' AS kind, s.query_start AS arrived
    FROM head h
    JOIN advisory a ON a.granted AND a.lock = {_as_lock("hashtextextended(h.next_owner, -2)")}
    LEFT JOIN pg_stat_activity s ON s.pid = a.pid
  UNION ALL
    SELECT 1, NULL, host(s.client_addr), NULL, NULL, a.waitstart, a.pid, 'exclusive',
        a.waitstart
    FROM advisory a LEFT JOIN pg_stat_activity s ON s.pid = a.pid
    WHERE NOT a.granted AND a.lock = {_as_lock("hashtextextended(%(key)s, 0)")}
  UNION ALL
    SELECT 2, w.owner, coalesce(w.host, host(s.client_addr)), w.pid, w.thread, w.since,
        a.pid, coalesce(w.kind, ''), w.since
    FROM advisory a JOIN pg_stat_activity s ON s.pid = a.pid AND s.state = 'idle'
    {_RECORDED}
    WHERE a.granted AND a.lock = {_as_lock("hashtextextended(%(key)s, -3)")}
  UNION ALL
    SELECT 3, w.owner, coalesce(w.host, host(s.client_addr)), w.pid, w.thread,
        coalesce(w.since, a.waitstart), a.pid, coalesce(w.kind, ''), a.waitstart
    FROM advisory a LEFT JOIN pg_stat_activity s ON s.pid = a.pid
    {_RECORDED}
    WHERE NOT a.granted AND a.lock = {_as_lock("hashtextextended(%(key)s, -3)")}
)
SELECT part, owner, host, pid, thread, since, session, kind FROM found
ORDER BY part, arrived, session LIMIT %(limit)s"""

#: Params: the keys (an array). Rows: (key, waiters) for each key with any.
COUNTS = f"""
WITH {_ADVISORY},
keys AS (SELECT unnest(%s::text[]) AS name),
queued AS (
    SELECT k.name, count(*) AS n FROM keys k JOIN advisory a ON NOT a.granted AND a.lock IN (
        {_as_lock("hashtextextended(k.name, 0)")}, {_as_lock("hashtextextended(k.name, -3)")})
    GROUP BY k.name
  UNION ALL
    SELECT name, 1 FROM {TABLE}
    WHERE name = ANY(%s::text[]) AND next_owner IS NOT NULL AND {_RESERVED}
  UNION ALL
    SELECT k.name, count(*) FROM keys k
    JOIN advisory a ON a.granted AND a.lock = {_as_lock("hashtextextended(k.name, -3)")}
    JOIN pg_stat_activity s ON s.pid = a.pid AND s.state = 'idle'
    GROUP BY k.name
)
SELECT name, sum(n)::int FROM queued GROUP BY name"""

def read_waiters(backend: LeaseBackend, key: str, limit: int) -> list[WaiterInfo]:
    """The waiters of the lock with storage key ``key``, first in line first.

    :param backend: a lease-mode backend on PostgreSQL or MySQL.
    :param key: the lock's storage key.
    :param limit: the most waiters returned.
    :returns: the waiters.
    :raises BackendUnavailable: when the database fails.
    """
    params = {"key": key, "limit": limit}
    if backend.vendor == "mysql":
        rows = backend.run(MYSQL_WAITERS, params, "listing waiters")
        return [
            WaiterInfo(position=i, owner=short_owner(owner), since=as_datetime(since),
                       host=host, pid=pid, thread=thread, kind=kind,
                       session=f"mysql {session}")
            for i, (owner, host, pid, thread, since, session, kind) in enumerate(rows, 1)
        ]
    rows = backend.run(WAITERS, params, "listing waiters")
    return [_waiter(i, row) for i, row in enumerate(rows, 1)]


def _waiter(position: int, row: tuple[Any, ...]) -> WaiterInfo:
    _, owner, host, pid, thread, since, session, kind = row
    when: datetime | None = as_datetime(since) if since is not None else None
    return WaiterInfo(
        position=position, owner=short_owner(owner) if owner else "", since=when,
        host=host or "", pid=pid, thread=thread or "", kind=kind,
        session=f"pg {session}" if session is not None else "",
    )


def count_waiters(backend: LeaseBackend, keys: list[str]) -> dict[str, int]:
    """How many wait for each of ``keys`` (one statement for a listing's page).

    :param backend: a lease-mode backend on PostgreSQL or MySQL.
    :param keys: storage keys.
    :returns: the count by key (0 where none waits).
    :raises BackendUnavailable: when the database fails.
    """
    if not keys:
        return {}
    if backend.vendor == "mysql":
        statement = WAITER_COUNTS.format(names=", ".join(["%s"] * len(keys)))
        rows = backend.run(statement, keys, "counting waiters")
    else:
        rows = backend.run(COUNTS, [keys, keys], "counting waiters")
    counts = dict.fromkeys(keys, 0)
    counts.update({name: n for name, n in rows})
    return counts
