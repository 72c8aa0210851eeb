"""Pruning the database backend's idle rows (``DatabaseBackend.prune``).

The backend keeps one row per name, and the row carries the name's fencing counter. A
row deleted and made anew would start its counter at 1 again: a token given twice,
which fencing forbids (docs/fencing.md). So a prune keeps, in the same transaction as
its deletes, the highest token of every row it deleted in a reserved row
(``sql.HIGH_WATER``), and a row made anew starts above it.

Only idle rows go: no holder for ``idle_for`` seconds (lease ended, or last granted,
that long ago), no reservation, no writer's mark, no reader or permit row. A row being
taken at that moment is never deleted under its taker:

- PostgreSQL: the rows are locked ``FOR UPDATE SKIP LOCKED`` (a row an acquirer has
  locked is skipped, and one that changed since the statement began is checked again),
  and the whole batch runs while the prune holds an advisory lock that every INSERT
  into the table takes shared (the trigger of sql/postgresql.sql). An acquirer whose row the
  batch deletes misses once and retries; its INSERT waits for the batch's commit and
  reads the high-water mark after it. The prune only *tries* for its lock, so it never
  queues in front of an acquirer; when it cannot have it, it tries again shortly.
- MySQL and MariaDB: one procedure call per batch (sql/mysql.sql), its rows locked ``FOR
  UPDATE SKIP LOCKED``; tokens come from one counter (``django_distlock_token``), so a row
  made anew starts above the pruned ones with no high-water row.
- SQLite: one writer at a time; a batch's deletes and its high-water mark are one
  transaction, and every statement that makes a row reads the mark.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.transaction import TransactionManagementError

from ...exceptions import BackendUnavailable
from .mysql_sql import PRUNE as MYSQL_PRUNE
from .shares_sql import SHARES
from .sql import HIGH_WATER, TABLE

if TYPE_CHECKING:
    from .backend import DatabaseBackend

#: The advisory lock (two-int4 form: apart from the backend's one-bigint locks) a prune
#: holds exclusive and every INSERT shared; ``'dist'`` and the migration's number.
PG_PRUNE_LOCK = (1684632436, 11)
#: Largest batch.
MAX_BATCH = 100_000

_PG_IDLE = f"""l.name <> %(high)s AND l.next_owner IS NULL
    AND (l.intent_owner IS NULL OR l.intent_until < now() - %(idle)s * interval '1 second')
    AND greatest(l.acquired_at, l.expires_at) < now() - %(idle)s * interval '1 second'
    AND NOT EXISTS (SELECT 1 FROM {SHARES} s WHERE s.name = l.name)"""
#: One batch, one statement: try for the prune lock; with it, delete up to ``batch`` idle
#: rows and raise the high-water mark to their highest token. Row: (had the lock, rows
#: deleted).
PG_PRUNE = f"""
WITH held AS MATERIALIZED (SELECT pg_try_advisory_xact_lock({PG_PRUNE_LOCK[0]},
        {PG_PRUNE_LOCK[1]}) AS ok),
gone AS (
    DELETE FROM {TABLE} WHERE name IN (
        SELECT l.name FROM {TABLE} l WHERE (SELECT ok FROM held) AND {_PG_IDLE}
        LIMIT %(batch)s FOR UPDATE OF l SKIP LOCKED)
    RETURNING fencing
), high AS (
    INSERT INTO {TABLE} (name, fencing, host, thread)
    SELECT %(high)s, max(fencing), '', '' FROM gone HAVING count(*) > 0
    ON CONFLICT (name) DO UPDATE SET fencing = greatest({TABLE}.fencing, excluded.fencing)
)
SELECT (SELECT ok FROM held), (SELECT count(*) FROM gone)"""

_SQLITE_CUTOFF = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %(cutoff)s)"
#: SQLite: delete one batch. Params: high, cutoff, batch. Rows: the tokens deleted.
SQLITE_PRUNE = f"""
DELETE FROM {TABLE} WHERE name IN (
    SELECT l.name FROM {TABLE} l WHERE l.name <> %(high)s AND l.next_owner IS NULL
        AND (l.intent_owner IS NULL OR l.intent_until < {_SQLITE_CUTOFF})
        AND coalesce(max(l.acquired_at, l.expires_at), l.acquired_at, l.expires_at)
            < {_SQLITE_CUTOFF}
        AND NOT EXISTS (SELECT 1 FROM {SHARES} s WHERE s.name = l.name)
    LIMIT %(batch)s)
RETURNING fencing"""
#: SQLite: raise the high-water mark. Params: high, token.
SQLITE_HIGH = f"""
INSERT INTO {TABLE} (name, fencing, host, thread) VALUES (%s, %s, '', '')
ON CONFLICT (name) DO UPDATE SET fencing = max(fencing, excluded.fencing)"""


def prune(backend: DatabaseBackend, idle_for: float, batch: int, wait: float) -> int:
    """Delete ``backend``'s idle rows, ``batch`` at a time, until none is left.

    :param backend: a database backend (either mode).
    :param idle_for: seconds a row must have been idle.
    :param batch: rows per transaction.
    :param wait: seconds to keep trying for the prune lock (PostgreSQL) when inserts
        hold it, per batch.
    :returns: the number of rows deleted.
    :raises ValueError: on a bad argument.
    :raises TransactionManagementError: SQLite, inside an atomic block: its deletes would
        be part of the caller's transaction (which may be the one holding a
        transaction-mode lock of this connection).
    :raises BackendUnavailable: when the database fails, or (PostgreSQL) the prune lock
        stayed taken for ``wait`` seconds.
    """
    if isinstance(idle_for, bool) or not isinstance(idle_for, int | float) or not (
        0 <= idle_for <= 10 * 365 * 86400
    ):
        raise ValueError(f"idle_for must be a number of seconds >= 0, got {idle_for!r}.")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be an int from 1 to {MAX_BATCH}, got {batch!r}.")
    if not backend.own_sessions and connections[backend.database].in_atomic_block:
        raise TransactionManagementError(
            f"Prune of lock alias {backend.alias!r}: run it outside any atomic block (on "
            "SQLite it would run inside the caller's transaction)."
        )
    one = {"postgresql": _pg_batch, "mysql": _mysql_batch}.get(backend.vendor, _sqlite_batch)
    total = 0
    while True:
        deleted = one(backend, float(idle_for), batch, wait)
        total += deleted
        if deleted < batch:
            return total


def _pg_batch(backend: DatabaseBackend, idle_for: float, batch: int, wait: float) -> int:
    params = {"high": HIGH_WATER, "idle": idle_for, "batch": batch}
    deadline = time.monotonic() + wait
    pause = 0.01
    while True:
        ok, deleted = backend.run(PG_PRUNE, params, "pruning idle lock rows")[0]
        if ok:
            return int(deleted)
        # An INSERT into the table holds the lock shared (a name's first use): brief.
        if time.monotonic() >= deadline:
            raise BackendUnavailable(
                f"Prune of lock alias {backend.alias!r}: rows were being created for "
                f"{wait:g} s without a pause; try again later."
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _mysql_batch(backend: DatabaseBackend, idle_for: float, batch: int, wait: float) -> int:
    # One call (sql/mysql.sql): the token counter keeps new rows' tokens above the pruned
    # ones, so no high-water row and no prune lock are needed.
    rows = backend.run(MYSQL_PRUNE, [idle_for, batch], "pruning idle lock rows")
    return int(rows[0][0])


def _sqlite_batch(backend: DatabaseBackend, idle_for: float, batch: int, wait: float) -> int:
    params: dict[str, Any] = {
        "high": HIGH_WATER, "cutoff": f"-{idle_for:.3f} seconds", "batch": batch,
    }
    with backend.errors.translating("pruning idle lock rows", backend.where), \
            transaction.atomic(using=backend.database), \
            connections[backend.database].cursor() as cursor:
        cursor.execute(SQLITE_PRUNE, params)
        tokens = [row[0] for row in cursor.fetchall()]
        if tokens:
            cursor.execute(SQLITE_HIGH, [HIGH_WATER, max(tokens)])
    return len(tokens)
