"""SQL of lease mode's read-write locks and semaphores: SQLite's statements, and the
calls of PostgreSQL's routines (``django_distlock/sql/postgresql.sql``,
which does the same steps in PL/pgSQL, one call per operation).

Every grant, release and extend of a share runs in one transaction whose first
statement locks the name's row (``lock_row``); the statements after it see every
share committed before (SQLite holds its write lock; PostgreSQL's READ COMMITTED takes
a new snapshot per statement, also in a function), and no other grant of the name runs
meanwhile. So "count the live shares, then add one" is decided on a stable count.

While shares are held, the row's ``owner`` is ``"~read"`` or ``"~semaphore"`` and its
``expires_at`` the latest end of its live shares (``recompute`` keeps it so): the
exclusive lock's statements, unchanged, see the name held until the last share
ends. A writer holds the row as an exclusive holder does, under its owner token with
``":w"`` appended (the listing tells the kinds apart; its short owner id is the
token's). Expiry is decided with the database's clock only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .sql import SQLITE_HIGH_WATER, TABLE

SHARES = "django_distlock_share"
READERS = "~read"
PERMITS = "~semaphore"
#: The row owner of each share kind.
SENTINEL = {"read": READERS, "semaphore": PERMITS}
SENTINELS = frozenset(SENTINEL.values())
#: Appended to a writer's owner token in the row (``owner`` is 64 wide, tokens 32).
WRITER_SUFFIX = ":w"
#: How long a waiting writer's mark keeps new readers out unless renewed (a waiting
#: writer renews it at each attempt, at least every quarter second).
INTENT_SECONDS = 2


@dataclass(frozen=True)
class ShareDialect:
    """SQLite's statements (named ``%(...)s`` placeholders)."""

    #: Create the name's row if new, and lock it until the transaction ends.
    #: Params: key.
    lock_row: str
    #: Grant a reader (``sentinel`` ``~read``, ``limit`` NULL) or a permit. Params: key,
    #: owner, sentinel, ttl, limit, host, pid, thread. Row on a grant: (fencing,
    #: acquired_at, the share's expires_at).
    grant_share: str
    #: After a grant: the share itself. Params: key, owner, kind, fencing, acquired_at,
    #: expires_at, host, pid, thread.
    insert_share: str
    #: Grant a writer. Params: key, owner (with the suffix), ttl, host, pid, thread.
    #: Row: (fencing, acquired_at, expires_at).
    grant_write: str
    #: After a miss. Params: key, limit. Row: (retry_after, stored limit that differs
    #: from ``limit`` while permits are held, else NULL).
    missed: str
    #: A waiting writer marks the name. Params: key, owner.
    mark_intent: str
    #: A writer that gives up withdraws its mark. Params: key, owner.
    drop_intent: str
    #: Release a share (and forget the name's expired ones). Params: key, owner.
    #: Rows: (valid,) for the share released, (false,) for each expired one.
    release_share: str
    #: Params: key, owner, ttl. Row: (fencing, acquired_at, expires_at).
    extend_share: str
    #: Make the row show the live shares again (owner NULL when none). Params: key.
    recompute: str
    #: Force release. Params: key, length of the short owner id (0: any), that id.
    #: Rows: one per share freed.
    force_shares: str
    #: Force release of the row's holder (with "" also the readers' or permits' row).
    #: Params: as ``force_shares``. Row when one was freed.
    force_row: str
    #: Listing: the live shares of the names, at most ``most`` per name (the first
    #: granted), in grant order. Params: the names, most.
    listed: str


def _listed(now: str) -> str:
    """The listing of every live share of some names (at most ``most`` each)."""
    return f"""
SELECT name, owner, fencing, acquired_at, expires_at, host, pid, thread, kind FROM (
    SELECT s.*, row_number() OVER (PARTITION BY s.name ORDER BY s.fencing) AS n
    FROM {SHARES} s WHERE s.name IN ({{names}}) AND s.expires_at > {now}
) listed WHERE n <= %(most)s ORDER BY fencing"""


def _dialect(now: str, later: str, intent: str, seconds_until: str) -> ShareDialect:
    live = f"s.name = %(key)s AND s.expires_at > {now}"
    free = f"owner IS NULL OR expires_at <= {now}"
    limit = "CAST(%(limit)s AS integer)"
    no_intent = f"(intent_owner IS NULL OR intent_owner = %(owner)s OR intent_until <= {now})"
    next_end = seconds_until.format(
        f"coalesce((SELECT min(s.expires_at) FROM {SHARES} s WHERE {live}), expires_at)"
    )
    return ShareDialect(
        lock_row=f"""
INSERT INTO {TABLE} (name, fencing, host, thread)
VALUES (%(key)s, {SQLITE_HIGH_WATER}, '', '')
ON CONFLICT (name) DO UPDATE SET fencing = {TABLE}.fencing WHERE false""",
        grant_share=f"""
UPDATE {TABLE} SET owner = %(sentinel)s, fencing = fencing + 1, acquired_at = {now},
    expires_at = CASE WHEN owner = %(sentinel)s AND expires_at > {later} THEN expires_at
        ELSE {later} END,
    host = %(host)s, pid = %(pid)s, thread = %(thread)s,
    share_limit = coalesce({limit}, share_limit)
WHERE name = %(key)s AND (
    EXISTS (SELECT 1 FROM {SHARES} s WHERE {live} AND s.owner = %(owner)s)
    OR (({free} OR owner = %(sentinel)s) AND CASE WHEN {limit} IS NULL
        THEN (intent_owner IS NULL OR intent_until <= {now})
        ELSE ({free} OR share_limit = {limit})
            AND (SELECT count(*) FROM {SHARES} s WHERE {live}) < {limit} END))
RETURNING fencing, acquired_at, {later}""",
        insert_share=f"""
INSERT INTO {SHARES} (name, owner, kind, fencing, acquired_at, expires_at, host, pid, thread)
VALUES (%(key)s, %(owner)s, %(kind)s, %(fencing)s, %(acquired_at)s, %(expires_at)s, %(host)s,
    %(pid)s, %(thread)s)
ON CONFLICT (name, owner) DO UPDATE SET fencing = excluded.fencing,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at""",
        grant_write=f"""
UPDATE {TABLE} SET owner = %(owner)s, fencing = fencing + 1, acquired_at = {now},
    expires_at = {later}, host = %(host)s, pid = %(pid)s, thread = %(thread)s,
    intent_owner = CASE WHEN intent_owner = %(owner)s THEN NULL ELSE intent_owner END
WHERE name = %(key)s AND ({free} OR owner = %(owner)s) AND {no_intent}
    AND NOT EXISTS (SELECT 1 FROM {SHARES} s WHERE {live})
RETURNING fencing, acquired_at, expires_at""",
        missed=f"""
SELECT {next_end},
    CASE WHEN owner = '{PERMITS}' AND expires_at > {now} AND share_limit <> {limit}
        THEN share_limit END
FROM {TABLE} WHERE name = %(key)s""",
        mark_intent=f"""
UPDATE {TABLE} SET intent_owner = %(owner)s, intent_until = {intent}
WHERE name = %(key)s AND {no_intent}""",
        drop_intent=f"""
UPDATE {TABLE} SET intent_owner = NULL, intent_until = NULL
WHERE name = %(key)s AND intent_owner = %(owner)s""",
        release_share=f"""
DELETE FROM {SHARES} WHERE name = %(key)s AND (owner = %(owner)s OR expires_at <= {now})
RETURNING owner = %(owner)s AND expires_at > {now}""",
        extend_share=f"""
UPDATE {SHARES} SET expires_at = {later}
WHERE name = %(key)s AND owner = %(owner)s AND expires_at > {now}
RETURNING fencing, acquired_at, expires_at""",
        recompute=f"""
UPDATE {TABLE} SET
    expires_at = coalesce((SELECT max(s.expires_at) FROM {SHARES} s WHERE {live}), expires_at),
    owner = CASE WHEN EXISTS (SELECT 1 FROM {SHARES} s WHERE {live}) THEN owner END
WHERE name = %(key)s AND owner IN ('{READERS}', '{PERMITS}')""",
        force_shares=f"""
DELETE FROM {SHARES} WHERE name = %(key)s AND expires_at > {now}
    AND substr(owner, 1, %(length)s) = %(expected)s
RETURNING fencing""",
        force_row=f"""
UPDATE {TABLE} SET owner = NULL
WHERE name = %(key)s AND owner IS NOT NULL AND expires_at > {now}
    AND substr(owner, 1, %(length)s) = %(expected)s
RETURNING 1""",
        listed=_listed(now),
    )


_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
SQLITE_SHARES = _dialect(
    now=_NOW,
    later="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %(ttl)s)",
    intent=f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+{INTENT_SECONDS} seconds')",
    seconds_until="(julianday({}) - julianday('now')) * 86400.0",
)

# PostgreSQL: one call per operation, the functions of sql/postgresql.sql; the casts
# pick each function's types.

#: One attempt. Params: key, owner, kind, ttl, limit, host, pid, thread, pass (may pass
#: the queue), head (heads it: leaves it with a grant), mark (a writer that will wait).
#: Row: (granted, fencing, acquired_at, expires_at, retry_after, stored limit, generation).
PG_GRANT = """SELECT * FROM django_distlock_share_grant(%(key)s, %(owner)s, %(kind)s,
    %(ttl)s::float8, %(limit)s::integer, %(host)s, %(pid)s::integer, %(thread)s,
    %(pass)s::boolean, %(head)s::boolean, %(mark)s::boolean)"""
#: Release a reader or a permit (a procedure: it gives the share's bell back, if bell,
#: after its commit). Params: key, owner, bell. Row: (valid,).
PG_RELEASE = "CALL django_distlock_share_release(%(key)s, %(owner)s, %(bell)s::boolean, NULL)"
#: Extend a reader or a permit. Params: key, owner, ttl. Row: (fencing, acquired_at,
#: expires_at), NULLs when not held.
PG_EXTEND = "SELECT * FROM django_distlock_share_extend(%(key)s, %(owner)s, %(ttl)s::float8)"
#: Force release. Params: key, expected (a short owner id, "": any). Row: (freed,).
PG_FORCE = "SELECT django_distlock_share_force(%(key)s, %(expected)s)"
#: Wait (``wait`` seconds at most) to head the name's queue of readers, writers and
#: permits, then listen on its channel. Params: key, wait. Row: (joined,).
PG_JOIN = "SELECT django_distlock_share_join(%(key)s, %(wait)s::float8)"
#: Before ``PG_JOIN``: record who is about to wait in the name's queue, on this session
#: (committed, so others see it while this one sleeps in the join: one
#: more round trip, for a thread that is going to wait anyway). Clears the rows of the
#: name's dead sessions. Params: key, kind, owner (short id), host, pid, thread.
PG_ENQUEUE = """
WITH gone AS (
    DELETE FROM django_distlock_share_waiter w
    WHERE w.name = %(key)s AND w.session <> pg_backend_pid() AND NOT EXISTS (
        SELECT 1 FROM pg_stat_activity s WHERE s.pid = w.session AND s.backend_start = w.started)
)
INSERT INTO django_distlock_share_waiter
    (session, started, name, kind, since, owner, host, pid, thread)
SELECT pg_backend_pid(), s.backend_start, %(key)s, %(kind)s, clock_timestamp(), %(owner)s,
    %(host)s, %(pid)s::integer, %(thread)s
FROM pg_stat_activity s WHERE s.pid = pg_backend_pid()
ON CONFLICT (session) DO UPDATE SET started = excluded.started, name = excluded.name,
    kind = excluded.kind, since = excluded.since, owner = excluded.owner,
    host = excluded.host, pid = excluded.pid, thread = excluded.thread"""
#: Leave the queue (if queued) and withdraw a writer's mark (owner, or NULL). Params:
#: key, queued, owner.
PG_LEAVE = "SELECT django_distlock_share_leave(%(key)s, %(queued)s::boolean, %(owner)s)"
#: Listing. Params: the names, most.
PG_LISTED = _listed("now()")
#: MySQL and MariaDB: the listing (their grants, releases and extends are the lease
#: procedures of sql/mysql.sql, every kind in one). Params: the names, most.
MYSQL_LISTED = _listed("UTC_TIMESTAMP(6)")
#: Most readers or permits of one name a listing shows (as the Redis backend).
SHARES_LISTED = 100


def pg_channel(key: str) -> str:
    """The channel the head of ``key``'s queue listens on (``django_distlock_share_wake``
    notifies it): ``django_distlock_`` and the MD5 of the key, in hex."""
    return "django_distlock_" + hashlib.md5(key.encode(), usedforsecurity=False).hexdigest()
