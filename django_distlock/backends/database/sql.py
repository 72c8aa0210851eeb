"""SQL of the database backend, one dialect per vendor.

Every statement is one round trip and decides expiry with the database's
clock. In the acquire upsert, the row lock that ``INSERT ... ON CONFLICT DO
UPDATE`` takes is what serialises the check-and-grant: it is the
``SELECT ... FOR UPDATE`` and the ``UPDATE`` of the textbook recipe fused
into one statement, so an uncontended acquire costs one round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

TABLE = "django_distlock_lock"
#: PostgreSQL: the sequence transaction-mode tokens come from (sql/postgresql.sql).
_FENCING = "django_distlock_fencing"
_COLUMNS = "name, owner, fencing, acquired_at, expires_at, host, pid, thread"
#: The reserved row that keeps the highest fencing token of every pruned row (``prune.py``):
#: no key can equal it, a key being printable. A row made anew starts above it (PostgreSQL:
#: the trigger of sql/postgresql.sql; SQLite: ``SQLITE_HIGH_WATER`` in each INSERT that makes one).
HIGH_WATER = "\x1edistlock:high-water"
#: (The name's control character is in the literal as it is: valid SQL on either vendor.)
SQLITE_HIGH_WATER = f"coalesce((SELECT fencing FROM {TABLE} WHERE name = '{HIGH_WATER}'), 0)"
#: PostgreSQL: until when a waiter's reservation keeps the lock (NULL: none); see
#: docs/database.md.
_RESERVED_UNTIL = (
    "CASE WHEN next_owner IS NOT NULL THEN expires_at + next_ttl * interval '1 second' END"
)
#: PostgreSQL: whether the row's reservation keeps others out now: it has not ended, and
#: its head is alive or the server crashed since it was made (see docs/database.md).
_RESERVED = (
    f"({_RESERVED_UNTIL} > now() AND NOT django_distlock_orphaned(next_owner, next_epoch))"
)


@dataclass(frozen=True)
class Dialect:
    """The statements of one vendor; placeholders are ``%s`` (``%(name)s`` where a
    statement uses a value more than once)."""

    #: Django's name of the vendor.
    vendor: str

    #: Grant if free or expired. Params: see ``acquire_params`` (PostgreSQL) and
    #: ``LeaseAcquisition`` (SQLite). Rows: (granted, fencing,
    #: acquired_at, expires_at, retry_after, generation) where generation, on PostgreSQL,
    #: is the fencing token when the session took the grant's generation lock (see
    #: docs/database.md), else None.
    acquire: str
    #: Only when ``acquire`` returns no row on a miss. Params: key. Row: (retry_after,).
    retry_after: str | None
    #: Params: key, owner (+ on PostgreSQL: the generation to give back or None).
    #: Row: (valid,).
    release: str
    #: Params: ttl, key, owner. Row: (fencing, acquired_at, expires_at).
    extend: str
    #: Params: key. Row when held.
    is_locked: str
    #: Params: lower bound (exclusive), prefix, upper bound, limit.
    held: str
    #: Params: key, length of the expected owner id (0: any owner), that id (MySQL's
    #: procedure: key, that id, "" for any owner). Row when a held lock was freed.
    force_release: str
    #: Transaction mode: bump fencing, holding the row lock until the transaction ends.
    #: Params: host, pid, thread, key. Row: (fencing, acquired_at); none if no row yet.
    tx_grant: str


POSTGRESQL = Dialect(
    vendor="postgresql",
    # The UPDATE locks the row only when it is free or expired (a concurrent
    # grant makes it re-check, READ COMMITTED's EvalPlanQual), so a miss is a
    # read: it writes nothing and never delays the holder. A first attempt
    # also defers to a queued waiter (the advisory lock of the key's queue,
    # held by its head, see docs/database.md), and every attempt to a waiter's
    # reservation until it ends (granting over one skips a fencing number):
    # no barging past the queue. An attempt retried after a lost connection finds
    # its own grant (same owner) and takes it again. The INSERT runs for a name's first use only;
    # ON CONFLICT DO NOTHING settles racing creators. A grant takes its
    # generation lock, which its release gives back: that wakes the head of
    # the queue inside the server.
    acquire=f"""
WITH u AS (
    UPDATE {TABLE} SET owner = %(owner)s,
        fencing = fencing + 1 + (next_owner IS NOT NULL)::int, acquired_at = now(),
        expires_at = now() + %(ttl)s * interval '1 second', host = %(host)s, pid = %(pid)s,
        thread = %(thread)s, next_owner = NULL
    WHERE name = %(key)s AND (owner IS NULL OR expires_at <= now() OR owner = %(owner)s)
        AND (next_owner IS NULL OR NOT {_RESERVED})
        AND (%(retry)s OR pg_try_advisory_xact_lock(hashtextextended(%(key)s, 0)))
    RETURNING fencing, acquired_at, expires_at
), i AS (
    INSERT INTO {TABLE} ({_COLUMNS})
    SELECT %(key)s, %(owner)s, 1, now(), now() + %(ttl)s * interval '1 second', %(host)s,
        %(pid)s, %(thread)s
    WHERE NOT EXISTS (SELECT 1 FROM {TABLE} WHERE name = %(key)s)
    ON CONFLICT (name) DO NOTHING
    RETURNING fencing, acquired_at, expires_at
)
SELECT true, fencing, acquired_at, expires_at, NULL::float8,
    CASE WHEN pg_try_advisory_lock(hashtextextended(%(key)s, fencing)) THEN fencing END
FROM (SELECT * FROM u UNION ALL SELECT * FROM i) g
UNION ALL
SELECT false, NULL, NULL, NULL,
    EXTRACT(EPOCH FROM greatest(l.expires_at, {_RESERVED_UNTIL}) - now())::float8, NULL
FROM {TABLE} l WHERE l.name = %(key)s AND NOT EXISTS (SELECT 1 FROM u)""",
    retry_after=None,
    # A procedure (docs/database.md): it hands the lock over to the reserved
    # head, commits without waiting for the WAL flush, then gives the grant's
    # generation lock back, which wakes the head.
    release="CALL django_distlock_release(%s, %s, %s, NULL)",
    extend=f"""
UPDATE {TABLE} SET expires_at = now() + %s * interval '1 second'
WHERE name = %s AND owner = %s AND expires_at > now()
RETURNING fencing, acquired_at, expires_at""",
    is_locked=f"""
SELECT 1 FROM {TABLE} WHERE name = %s
    AND ((owner IS NOT NULL AND expires_at > now()) OR {_RESERVED})""",
    held=f"""
SELECT {_COLUMNS} FROM {TABLE}
WHERE owner IS NOT NULL AND (name COLLATE "C") > %s AND (name COLLATE "C") >= %s
  AND (name COLLATE "C") < %s AND expires_at > now()
ORDER BY (name COLLATE "C") LIMIT %s""",
    force_release=f"""
UPDATE {TABLE} SET owner = NULL, next_owner = NULL
WHERE name = %s AND owner IS NOT NULL AND expires_at > now() AND substr(owner, 1, %s) = %s
RETURNING 1""",
    # The token comes from a sequence (sql/postgresql.sql), whose numbers are not
    # transactional: a grant rolled back, or whose session died, never gives its number
    # again. Above the row's last token: a row whose token (from lease mode, say) is not
    # below the sequence draws as many numbers as it takes to pass it (at least one: other
    # sessions may have drawn between the two reads of the sequence).
    tx_grant=f"""
UPDATE {TABLE} SET fencing = CASE WHEN (SELECT last_value FROM {_FENCING}) >= fencing
        THEN nextval('{_FENCING}')
        ELSE (SELECT max(nextval('{_FENCING}'))
              FROM generate_series(0, GREATEST(0, fencing - (SELECT last_value FROM {_FENCING}))))
    END,
    acquired_at = clock_timestamp(), host = %s, pid = %s, thread = %s
WHERE name = %s RETURNING fencing, acquired_at""",
)

#: Transaction mode: create the row of a new name, committed (on the lease connection),
#: so that other sessions see the row, and its lock, while it is held. Params: key.
ENSURE_ROW = f"""
INSERT INTO {TABLE} (name, fencing, host, thread) VALUES (%s, 0, '', '')
ON CONFLICT (name) DO NOTHING"""
#: SQLite: ``ENSURE_ROW``, the row starting at the pruned rows' high-water mark.
SQLITE_ENSURE_ROW = f"""
INSERT INTO {TABLE} (name, fencing, host, thread) VALUES (%s, {SQLITE_HIGH_WATER}, '', '')
ON CONFLICT (name) DO NOTHING"""
#: PostgreSQL transaction mode, non-blocking: take the row lock or fail at once.
PG_TX_NOWAIT = f"SELECT 1 FROM {TABLE} WHERE name = %s FOR UPDATE NOWAIT"
#: PostgreSQL lease connections: bound every row-lock wait of the session, and have the
#: server check, while a statement runs, that the client is still there (a waiter whose
#: process died leaves the queue instead of being handed the lock; Django needs
#: PostgreSQL 14+, which has the setting). Params: the timeout, the check's interval.
PG_SESSION_SETUP = (
    "SELECT set_config('lock_timeout', %s, false),"
    " set_config('client_connection_check_interval', %s, false)"
)
#: PostgreSQL transaction mode, blocking: bound the grant's lock waits, and the grant as a
#: whole (one statement may wait for several locks in turn), for the wait only. The
#: settings in force before (the caller's own included) are kept in two settings of the
#: transaction, which ``PG_TX_GRANT_WAITED`` puts back, so that the three statements of a
#: wait go in one round trip. Params: both limits (the same value).
PG_TX_TIMEOUTS = """
WITH was AS MATERIALIZED (
    SELECT current_setting('lock_timeout') AS l, current_setting('statement_timeout') AS s
)
SELECT set_config('django_distlock.lock_timeout', l, true),
    set_config('django_distlock.statement_timeout', s, true),
    set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true)
FROM was"""
#: PostgreSQL transaction mode, blocking: ``tx_grant``, then (the wait over, the row
#: locked, or no row found) the settings that ``PG_TX_TIMEOUTS`` kept put back: one row
#: always, so that no statement after this one runs under the wait's bounds. The
#: statement's own timeout was armed when it began, so the reset bounds nothing after it.
#: Params: host, pid, thread, key. Row: (fencing, acquired_at, _, _), the first two NULL if
#: the name has no row.
PG_TX_GRANT_WAITED = f"""
WITH granted AS ({POSTGRESQL.tx_grant})
SELECT granted.fencing, granted.acquired_at,
    set_config('lock_timeout', current_setting('django_distlock.lock_timeout'), true),
    set_config('statement_timeout', current_setting('django_distlock.statement_timeout'), true)
FROM (SELECT) AS one LEFT JOIN granted ON true"""
#: PostgreSQL transaction mode, after ``PG_TX_GRANT_WAITED``: the session's next statement,
#: ours. The grant's statement timer may fire after the statement's last interrupt check
#: (its backend descheduled at the very end); PostgreSQL then keeps the cancel pending and
#: raises it at the session's next statement, which would be the caller's first query or
#: its COMMIT. This statement takes it instead (57014: the grant is given up, a miss).
PG_TX_SETTLE = "SELECT 1"
#: PostgreSQL transaction mode: one page of names with the held ones marked. A
#: transaction-mode holder keeps its row locked (FOR [NO KEY] UPDATE), so ``FOR SHARE
#: SKIP LOCKED`` returns exactly the rows nobody holds (a prune locks the high-water row:
#: left out). Params (named): after, low, high, limit.
PG_TX_HELD = f"""
WITH page AS (
    SELECT name FROM {TABLE}
    WHERE (name COLLATE "C") > %(after)s AND (name COLLATE "C") >= %(low)s
        AND (name COLLATE "C") < %(high)s AND name <> '{HIGH_WATER}'
    ORDER BY (name COLLATE "C") LIMIT %(limit)s
), free AS (
    SELECT name FROM {TABLE} WHERE name IN (SELECT name FROM page) FOR SHARE SKIP LOCKED
)
SELECT {_COLUMNS}, name IN (SELECT name FROM free) FROM {TABLE}
WHERE name IN (SELECT name FROM page) ORDER BY (name COLLATE "C")"""
#: PostgreSQL transaction mode: is the row of a name locked by an open transaction?
PG_TX_IS_LOCKED = f"""
WITH free AS (SELECT name FROM {TABLE} WHERE name = %s FOR SHARE SKIP LOCKED)
SELECT EXISTS (SELECT 1 FROM {TABLE} WHERE name = %s) AND NOT EXISTS (SELECT 1 FROM free)"""

#: PostgreSQL lease mode, blocking: queue in the server and take the lock when it comes
#: (the procedure is in django_distlock/sql/postgresql.sql, docs/database.md explains it).
#: Params: key, owner, ttl, host, pid, thread, seconds to wait. Row: as ``acquire``'s,
#: except that on a grant its fifth column is the seconds the server waited before granting.
PG_WAIT = (
    "CALL django_distlock_wait(%s, %s, %s, %s, %s, %s, %s, NULL, NULL, NULL, NULL, NULL, NULL)"
)
#: PostgreSQL lease mode: take back the reservation a cancelled wait left in the row
#: (``next_owner``; lease.PgLeaseAcquisition._withdraw). Params: key, owner.
PG_WITHDRAW = f"UPDATE {TABLE} SET next_owner = NULL WHERE name = %s AND next_owner = %s"
#: PostgreSQL lease mode: give back a grant's generation lock (released elsewhere).
#: Params: key, generation.
PG_UNLOCK_GENERATION = "SELECT pg_advisory_unlock(hashtextextended(%s, %s))"


def is_locked_where(now: str) -> str:
    """``is_locked`` where names compare as stored (SQLite, MySQL's binary collation),
    ``now`` the vendor's clock. Params: key. Row when held."""
    return f"""
SELECT 1 FROM {TABLE} WHERE name = %s AND owner IS NOT NULL AND expires_at > {now}"""


# SQLite keeps times as text; these formats sort as they compare. Its 'now'
# is fixed for the duration of a statement.
_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
_LATER = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

SQLITE = Dialect(
    vendor="sqlite",
    acquire=f"""
INSERT INTO {TABLE} ({_COLUMNS})
VALUES (%s, %s, 1 + {SQLITE_HIGH_WATER}, {_NOW}, {_LATER}, %s, %s, %s)
ON CONFLICT (name) DO UPDATE SET
    owner = excluded.owner, fencing = fencing + 1, acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at, host = excluded.host, pid = excluded.pid,
    thread = excluded.thread
WHERE owner IS NULL OR expires_at <= {_NOW}
RETURNING 1, fencing, acquired_at, expires_at, NULL, NULL""",
    retry_after=f"""
SELECT (julianday(expires_at) - julianday('now')) * 86400.0 FROM {TABLE} WHERE name = %s""",
    release=f"""
UPDATE {TABLE} SET owner = NULL WHERE name = %s AND owner = %s
RETURNING expires_at > {_NOW}""",
    extend=f"""
UPDATE {TABLE} SET expires_at = {_LATER}
WHERE name = %s AND owner = %s AND expires_at > {_NOW}
RETURNING fencing, acquired_at, expires_at""",
    is_locked=is_locked_where(_NOW),
    held=f"""
SELECT {_COLUMNS} FROM {TABLE}
WHERE owner IS NOT NULL AND name > %s AND name >= %s AND name < %s AND expires_at > {_NOW}
ORDER BY name LIMIT %s""",
    force_release=f"""
UPDATE {TABLE} SET owner = NULL
WHERE name = %s AND owner IS NOT NULL AND expires_at > {_NOW} AND substr(owner, 1, %s) = %s
RETURNING 1""",
    tx_grant=f"""
UPDATE {TABLE} SET fencing = fencing + 1, acquired_at = {_NOW}, host = %s, pid = %s, thread = %s
WHERE name = %s RETURNING fencing, acquired_at""",
)


def release_params(key: str, token: str, generation: int | None) -> list[object]:
    """The parameters of a lease release (PostgreSQL, MySQL); ``generation``: the grant's
    generation lock when the releasing session holds it, else None."""
    return [key, token, generation]


def acquire_params(
    key: str,
    token: str,
    ttl: float,
    host: str,
    pid: int | None,
    thread: str,
    *,
    retry: bool = False,
    kind: str = "exclusive",
    limit: int | None = None,
) -> dict[str, object]:
    """The parameters of a lease attempt (PostgreSQL, MySQL).

    :param retry: a waiter's retry, which may pass a queued waiter (it is the
        queue's head).
    :param kind: the kind of lock (MySQL's procedure serves every kind; PostgreSQL's
        statement, the exclusive lock's, does not read it).
    :param limit: a semaphore's limit (MySQL).
    """
    return {"key": key, "owner": token, "ttl": ttl, "host": host, "pid": pid,
            "thread": thread, "retry": retry, "kind": kind, "limit": limit}


def sqlite_ttl(seconds: float) -> str:
    """The SQLite date modifier adding ``seconds`` (millisecond resolution)."""
    return f"+{seconds:.3f} seconds"


def as_datetime(value: object) -> datetime | None:
    """Return a database time as an aware UTC datetime (SQLite gives text)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value if value.tzinfo is UTC else value.astimezone(UTC)
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


def upper_bound(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix``."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code <= 0x10FFFF:
            chars[-1] = chr(0xE000 if 0xD800 <= code <= 0xDFFF else code)
            return "".join(chars)
        chars.pop()
    return "\U0010ffff" * 256  # no prefix: above every key (keys are <= 255 characters)
