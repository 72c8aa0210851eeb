"""``scale.server.pg``: WAL, commits and rows per lock on PostgreSQL, from its statistics.

On the benchmarks' database (``benchmarks.pg.setup()`` creates and migrates it), one
psycopg 3 or Django connection per case:

- ``pg.advisory``: ``pg_advisory_lock(k)`` + ``pg_advisory_unlock(k)`` (``benchmarks.pg``'s
  statements): no row, nothing written;
- ``pg.floor``: the backend's own two lease statements sent by hand (``benchmarks.pg``'s
  ``HandLease``: ``sql.POSTGRESQL.acquire`` / ``.release``; reference ``floor``);
- ``pg.lease`` and ``pg.tx``: ``locks["pg"]`` (lease mode) and ``locks["pg-tx"]``
  (transaction mode: the held locks nest in one transaction, released last first).

**WAL B/pair**: ``pg_current_wal_lsn()`` differenced around the pairs (server-wide: the
run must be alone on the server). **commits/pair**: ``pg_stat_database.xact_commit`` of
the database, differenced; a backend reports its counts when it goes idle at most once a
second (else 10 s later) and when it exits, so the case's connections are closed before
the second read, which is repeated until it holds still; each read is a fresh
connection whose own commit is subtracted; and the commits of the same client run with
no counted pair (its set-up and warm-up, reported late) are subtracted.
**rows/held**: ``django_distlock_lock`` rows of the held names, **row B/held** their mean
``pg_column_size``, **table B/held** the growth of ``pg_total_relation_size`` (table +
indexes; 0 when the rows fit in space an earlier case freed), **rows left/name**: rows
of the names after their release.
"""

from __future__ import annotations

import time
from typing import Any

from . import pg as base
from .harness import Case, Column
from .scale_server import (
    WARMUP,
    DistLockClient,
    Handle,
    add,
    client_of,
    fmt,
    hold,
    pairs,
    per,
    register,
    release_all,
)

PREFIX = "scale:"
TABLE = "django_distlock_lock"


def setup() -> None:
    """Create and migrate the benchmarks' database (``benchmarks.pg.setup``); delete the
    ``scale:`` rows an interrupted run left.

    :raises Unavailable: when no PostgreSQL is configured.
    """
    base.setup()
    _cleanup()


def _cleanup() -> None:
    with base.connect() as conn:
        conn.execute(f"DELETE FROM {TABLE} WHERE name LIKE 'scale:%'")


def describe() -> str:
    """The server's settings (``benchmarks.pg.describe``)."""
    return base.describe() + " (scale.server)"


# --------------------------------------------------------------------------- clients


class _Hand:
    """One name's lock on a shared :class:`benchmarks.pg.HandLease` connection."""

    def __init__(self, lease: base.HandLease, name: str) -> None:
        self.lease, self.name = lease, name
        self.token, self.generation = "", None

    def acquire(self) -> bool:
        self.lease.key = self.name
        ok = self.lease.acquire()
        self.token, self.generation = self.lease.token, self.lease.generation
        return ok

    def release(self) -> None:
        lease = self.lease
        lease.key, lease.token, lease.generation = self.name, self.token, self.generation
        lease.release()


class HandLease:
    """The lease statements by hand, one connection (``benchmarks.pg.HandLease``)."""

    def __init__(self) -> None:
        self.lease = base.HandLease("")

    def lock(self, name: str) -> Handle:
        return _Hand(self.lease, name)

    def close(self) -> None:
        self.lease.close()


class _Advisory:
    def __init__(self, locker: base.Advisory, name: str) -> None:
        self.locker, self.params = locker, [base.advisory_key(name)]

    def acquire(self) -> bool:
        self.locker.params = self.params
        return self.locker.acquire()

    def release(self) -> None:
        self.locker.params = self.params
        self.locker.release()


class Advisory:
    """``pg_advisory_lock`` / ``pg_advisory_unlock``, one session (``benchmarks.pg``)."""

    def __init__(self) -> None:
        self.locker = base.Advisory("")

    def lock(self, name: str) -> Handle:
        return _Advisory(self.locker, name)

    def close(self) -> None:
        self.locker.close()


def lease() -> DistLockClient:
    """``locks["pg"]``: lease mode."""
    return DistLockClient("pg")


def transaction_mode() -> DistLockClient:
    """``locks["pg-tx"]``: transaction mode."""
    return DistLockClient("pg-tx")


# --------------------------------------------------------------------------- accounting


def _read() -> tuple[int, int]:
    """(WAL position in bytes, the database's committed transactions), on a fresh
    connection (its own commit is counted once it exits)."""
    with base.connect() as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, xact_commit"
            " FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _settled(wal0: int, commits0: int, settled: bool) -> tuple[int, int]:
    """WAL and commits since ``(wal0, commits0)`` once the commit count holds still, less
    the meter's own reads."""
    reads, wal, commits, last = 1, wal0, commits0, -1
    for _ in range(12 if settled else 1):
        time.sleep(0.3 if settled else 0)
        wal, commits = _read()
        own = commits - commits0 - reads
        if own == last:
            break
        last, reads = own, reads + 1
    return wal - wal0, commits - commits0 - reads


def _rows(prefix: str) -> tuple[int, float, int]:
    with base.connect() as conn:
        row = conn.execute(
            f"SELECT count(*), coalesce(avg(pg_column_size(t.*)), 0),"
            f" pg_total_relation_size('{TABLE}') FROM {TABLE} t WHERE name LIKE %s",
            [prefix + "%"],
        ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1]), int(row[2])


def _window(case: Case, prefix: str, count: int, settled: bool) -> tuple[int, int, float]:
    """WAL bytes, commits and wall seconds of a client that runs :data:`WARMUP` pairs,
    then ``count`` counted ones, and closes (its backends exit: the counts it had not
    reported yet, those of its set-up and warm-up too, reach ``pg_stat_database``)."""
    client = client_of(case)
    try:
        pairs(client, f"{prefix}:w", WARMUP)
        wal0, commits0 = _read()
        wall = pairs(client, prefix, count)
    finally:
        client.close()
    wal, commits = _settled(wal0, commits0, settled)
    return wal, commits, wall


def measure(case: Case, count: int, settled: bool) -> dict[str, Any]:
    """The row of one case (see the module's docstring)."""
    prefix = f"{PREFIX}{case.name}"
    _, idle, _ = _window(case, f"{prefix}:z", 0, settled)  # the client's own, no pair
    wal, commits, wall = _window(case, f"{prefix}:p", count, settled)
    commits -= idle
    held_prefix = f"{prefix}:h:"
    client = client_of(case)
    try:
        rows0, _, size0 = _rows(held_prefix)
        held = hold(client, held_prefix.rstrip(":"), count)
        try:
            rows1, row_bytes, size1 = _rows(held_prefix)
        finally:
            release_all(held)
        rows2, _, _ = _rows(held_prefix)
    finally:
        client.close()
        _cleanup()
    return {
        "wal": per(wal, count),
        "commits": per(commits, count),
        "wall_us": per(wall * 1e6, count),
        "rows_held": per(rows1 - rows0, count),
        "row_bytes": row_bytes,
        "table_bytes": per(size1 - size0, count),
        "rows_left": per(rows2 - rows0, count),
    }


SUITE = register(
    "pg",
    "Server cost per lock on PostgreSQL (WAL, `pg_stat_database`, rows)",
    measure,
    (
        Column("wal", "WAL B/pair", fmt(0)),
        Column("commits", "commits/pair", fmt(2)),
        Column("wall_us", "wall µs/pair", fmt(1)),
        Column("rows_held", "rows/held lock", fmt(2)),
        Column("row_bytes", "row B/held", fmt(0)),
        Column("table_bytes", "table B/held", fmt(0)),
        Column("rows_left", "rows left/name", fmt(2)),
    ),
    "wal",
    "WAL: `pg_current_wal_lsn()` deltas; commits: `pg_stat_database.xact_commit` deltas "
    "(the meter's own subtracted); rows: `django_distlock_lock`. `x ref`: WAL bytes over "
    "that row's.",
)
_G = "postgres"
add(SUITE, "pg.advisory", Advisory, "`pg_advisory_lock` + `pg_advisory_unlock`", group=_G)
add(SUITE, "pg.floor", HandLease, "the backend's 2 lease statements by hand", group=_G,
    reference="floor")
add(SUITE, "pg.lease", lease, "django-distlock, lease mode", group=_G)
add(SUITE, "pg.tx", transaction_mode, "django-distlock, transaction mode", group=_G)
