"""SQL of the database backend on MySQL and MariaDB (InnoDB); the routines are in
``django_distlock/sql/mysql.sql``.

MySQL has no ``RETURNING`` on ``UPDATE`` and no partial indexes; a statement's lock wait
is bounded in whole seconds by ``innodb_lock_wait_timeout``, so a wait that must end
sooner is bounded per statement (MariaDB's ``SET STATEMENT max_statement_time``, MySQL
8's ``MAX_EXECUTION_TIME`` hint), never by a setting that would outlive it. Names
compare by bytes (the binary collation ``sql/mysql.sql`` gives the name columns).
"""

from __future__ import annotations

import math

from .sql import _COLUMNS, TABLE, Dialect, is_locked_where

#: The hash that names a lock's server-wide named locks (sql/mysql.sql): of the database
#: and the storage key given as ``{key}``.
_HASH = "LEFT(SHA2(CONCAT(DATABASE(), 0x00, {key}), 256), 32)"
_NOW = "UTC_TIMESTAMP(6)"

MYSQL = Dialect(
    vendor="mysql",
    # The procedures are in sql/mysql.sql: one round trip each, one row each.
    # Every kind (``acquire_params``' kind and limit); its row has a seventh column, a
    # semaphore's stored limit when it is not ``limit``.
    acquire="CALL django_distlock_acquire(%(key)s, %(owner)s, %(kind)s, %(limit)s, %(ttl)s, "
    "%(host)s, %(pid)s, %(thread)s, %(retry)s)",
    retry_after=None,
    release="CALL django_distlock_release(%s, %s, %s)",
    extend="CALL django_distlock_extend(%s, %s, %s)",
    is_locked=is_locked_where(_NOW),
    # The held rows by name: a range of the generated column's index (sql/mysql.sql).
    held=f"""
SELECT {_COLUMNS} FROM {TABLE}
WHERE held_name > %s AND held_name >= %s AND held_name < %s AND expires_at > {_NOW}
ORDER BY held_name LIMIT %s""",
    # Params: key, the expected owner id ("": any).
    force_release="CALL django_distlock_force(%s, %s)",
    tx_grant="CALL django_distlock_tx_grant(%s, %s, %s, %s)",
)

#: Lease mode, blocking: queue for the name and take it when it comes (sql/mysql.sql).
#: Params: key, owner, kind, limit, ttl, host, pid, thread, seconds to wait. Row: as
#: ``acquire``'s, except that on a grant its fifth column is the seconds the server waited.
WAIT = "CALL django_distlock_wait(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
#: Lease mode: give back a grant's generation lock (released through another session).
#: Params: key, generation.
MYSQL_UNLOCK_GENERATION = (
    f"DO RELEASE_LOCK(CONCAT('dl:g:', {_HASH.format(key='%s')}, ':', %s))"
)
#: Delete one batch of idle rows. Params: idle seconds, batch. Row: (deleted,).
PRUNE = "CALL django_distlock_prune(%s, %s)"
#: Stop a session's running statement. Params: its connection id.
KILL_QUERY = "KILL QUERY %s"

#: Lease mode: who waits for a name, as they recorded themselves (sql/mysql.sql); a row
#: counts while its connection holds its liveness lock. Params (named): key, limit. Rows:
#: (owner, host, pid, thread, since, session, kind), in arrival order.
WAITERS = """
SELECT w.owner, w.host, w.pid, w.thread, w.since, w.session, w.kind
FROM django_distlock_waiter w
WHERE w.name = %(key)s AND IS_USED_LOCK(w.alive) = w.session
ORDER BY w.since, w.session LIMIT %(limit)s"""
#: Lease mode: how many wait for each of a page's names. ``{names}``: a placeholder per
#: key. Rows: (key, waiters) for each key with any.
WAITER_COUNTS = """
SELECT w.name, count(*) FROM django_distlock_waiter w
WHERE w.name IN ({names}) AND IS_USED_LOCK(w.alive) = w.session GROUP BY w.name"""
#: Lease mode: one page of held names by age. ``{column}``: the order's column, whose
#: generated copy (NULL while the row is free, sql/mysql.sql) is indexed with the name.
#: The range starts at the cursor's time (the server makes no range of a row comparison).
#: Params: lower (prefix), upper, the cursor's time, the cursor's time and key, limit.
BY_AGE = f"""
SELECT {_COLUMNS} FROM {TABLE}
WHERE expires_at > {_NOW} AND name >= %s AND name < %s
  AND held_{{column}} >= %s AND (held_{{column}}, name) > (%s, %s)
ORDER BY held_{{column}}, name LIMIT %s"""

#: The backend's own connections (lease statements, rows made apart from the caller's
#: transaction, listings): times in UTC, row waits bounded to a second, and READ COMMITTED,
#: whose locking reads take no gap locks (a listing must not keep names from being made).
SESSION_SETUP = (
    "SET SESSION time_zone = '+00:00', innodb_lock_wait_timeout = 1",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
)

#: Transaction mode, non-blocking: take the row lock or fail at once (1205 on MariaDB,
#: 3572 on MySQL 8). Params: key. Row if the name has a row.
TX_NOWAIT = f"SELECT 1 FROM {TABLE} WHERE name = %s FOR UPDATE NOWAIT"


def tx_wait(seconds: float, mariadb: bool) -> str:
    """Transaction mode, blocking: take the row lock within ``seconds`` (a fraction
    counts), a bound of this statement only. Params: key. Row if the name has a row."""
    if mariadb:
        return (f"SET STATEMENT max_statement_time = {max(seconds, 0.001):.3f} FOR "
                f"SELECT 1 FROM {TABLE} WHERE name = %s FOR UPDATE")
    millis = max(1, round(seconds * 1000))
    whole = max(1, math.ceil(seconds))  # innodb_lock_wait_timeout: whole seconds
    return (f"SELECT /*+ MAX_EXECUTION_TIME({millis}) "
            f"SET_VAR(innodb_lock_wait_timeout = {whole}) */ 1 "
            f"FROM {TABLE} WHERE name = %s FOR UPDATE")


#: Transaction mode: stamp the grant of the row the caller's transaction just locked.
#: Params: key, host, pid, thread. Row: (fencing, acquired_at), none if no row.
TX_GRANT = "CALL django_distlock_tx_grant(%s, %s, %s, %s)"

#: Make a name's row, committed on the backend's own connection, unless it exists. The
#: existence test is a plain read there (READ COMMITTED): it waits for no row lock,
#: where ``INSERT IGNORE`` or ``ON DUPLICATE KEY UPDATE`` would wait for the holder's.
#: A creator that races us fails with a duplicate key (1062): the row exists. Params:
#: key, key.
ENSURE_ROW = f"""
INSERT INTO {TABLE} (name, fencing, host, thread)
SELECT %s, 0, '', '' FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {TABLE} WHERE name = %s)"""

#: Transaction mode: whether the name is held, i.e. its row exists and is locked. A
#: locking read that skips locked rows (on the backend's connection, in autocommit: its
#: lock ends with the statement). Params: key, key. Row: (held,).
TX_IS_LOCKED = f"""
SELECT EXISTS (SELECT 1 FROM {TABLE} WHERE name = %s) AND NOT EXISTS (
    SELECT 1 FROM (SELECT name FROM {TABLE} WHERE name = %s FOR UPDATE SKIP LOCKED) f)"""

#: Transaction mode: one page of names, each with whether it is free (its row lock could
#: be taken). The free ones are the first ``limit`` unlocked rows of the range, which hold
#: every unlocked row of the page. Params (named): after, low, high, limit. Rows: the
#: columns, then free.
TX_HELD = f"""
SELECT l.name, l.owner, l.fencing, l.acquired_at, l.expires_at, l.host, l.pid, l.thread,
    f.name IS NOT NULL
FROM (
    SELECT name FROM {TABLE}
    WHERE name > %(after)s AND name >= %(low)s AND name < %(high)s
    ORDER BY name LIMIT %(limit)s
) p
JOIN {TABLE} l ON l.name = p.name
LEFT JOIN (
    SELECT name FROM {TABLE}
    WHERE name > %(after)s AND name >= %(low)s AND name < %(high)s
    ORDER BY name LIMIT %(limit)s FOR UPDATE SKIP LOCKED
) f ON f.name = p.name
ORDER BY p.name"""


# -- Session mode (backends/database/session_mysql.py; the routines in sql/mysql.sql) --

#: Session mode's grant and release, sent without a cursor (``session_mysql._query``):
#: bytes, the arguments written in as literals.
#:
#: Take a name's lock and record the holder. Params: lock, key, seconds to wait (0: a
#: try), label (``dl <short owner id> <holder>``), host; pid, and whether the session
#: holds nothing else. Row: (fencing token, or NULL when not had; server time; the run's
#: epoch and base).
SESSION_TAKE = b"CALL django_distlock_session_take(%b, %b, %b, %b, %b, %d, %d)"
#: A try without the procedure, for a session that knows its run's epoch and has no row
#: past slot 0 (``session_mysql.SessionRun``), whose slot-0 row names another lock or
#: holder: one statement writes the holder's row at slot 0 only if the lock is granted,
#: and draws ``UUID_SHORT()`` then, which the OK packet carries back as the last insert id
#: (no result set). Granted: 1 or 2 rows (inserted or updated), else 0. ``GET_LOCK`` in
#: the ``WHERE`` of an ``INSERT ... SELECT`` holds the table's lock while it runs: a try
#: only, never a wait. Params: lock, key, label (the holder part), host, pid, lock.
SESSION_TRY = b"""INSERT INTO django_distlock_session_grant
    (session, slot, lk, name, label, host, pid)
SELECT CONNECTION_ID(), 0, %b, %b, %b, %b, %d FROM DUAL
WHERE GET_LOCK(%b, 0) = 1 AND LAST_INSERT_ID(UUID_SHORT()) IS NOT NULL
ON DUPLICATE KEY UPDATE lk = VALUES(lk), name = VALUES(name), label = VALUES(label),
    host = VALUES(host), pid = VALUES(pid)"""
#: A try that writes nothing, for a session whose slot-0 row already names this lock and
#: holder (it counts again once the lock is granted): the raw call and the run's
#: ``UUID_SHORT()``. Row: (``UUID_SHORT()``, or NULL when not had). Params: lock.
SESSION_GRANT = b"SELECT IF(GET_LOCK(%b, 0) = 1, UUID_SHORT(), NULL)"
#: ``SESSION_GRANT``, waiting up to the given seconds; the label, host and pid after it
#: are for the waiters' listing, which reads them from the process list. Params: lock,
#: seconds, label, host, pid.
SESSION_WAIT = b"SELECT IF(GET_LOCK(%b, %b) = 1, UUID_SHORT(), NULL), %b, %b, %d"
#: Give the name's lock back. Params: lock. Row: (1 when it was held,).
SESSION_UNLOCK = b"SELECT RELEASE_LOCK(%b)"
#: Whether this session holds the lock (params: lock).
SESSION_HOLDS = "SELECT IS_USED_LOCK(%s) <=> CONNECTION_ID()"
SESSION_IS_LOCKED = "SELECT IS_USED_LOCK(%s) IS NOT NULL"
#: A new session keeps its holder rows out of the binary log where its user may, takes
#: the lock that says it lives, and deletes the rows of sessions that are gone: the table
#: keeps about one row per open session.
SESSION_OPEN = "CALL django_distlock_session_open()"
#: The waits for session-mode locks, by lock: the server's process list shows each
#: waiting session's statement (the procedure's call, or ``SESSION_WAIT``), whose first
#: argument is the lock (a session sees the other sessions of its own user, or all with
#: the PROCESS privilege).
_WAITS = """
SELECT IF(p.INFO LIKE 'C%%', SUBSTRING(p.INFO, 36, 37), SUBSTRING(p.INFO, 21, 37)) AS lk,
    p.ID, p.TIME_MS, p.INFO
FROM information_schema.PROCESSLIST p
WHERE p.STATE = 'User lock' AND (
    p.INFO LIKE 'CALL django\\_distlock\\_session\\_take(''dl:s:%%'
    OR p.INFO LIKE 'SELECT IF(GET\\_LOCK(''dl:s:%%')"""
#: When a holder was granted: its session's last statement ended (it is idle while it
#: holds), as the process list tells; NULL for a session the listing's user does not see.
#: A waiter's wait began the same way (its statement's time). Format: the list's alias.
_SINCE = "UTC_TIMESTAMP(6) - INTERVAL ROUND({}.TIME_MS * 1000) MICROSECOND"
#: A page of held names, with the waiters of each counted from one read of the process
#: list (not one per row). Params: after, low, high, limit. Rows: name, holder, since,
#: host, pid, session, waiters.
SESSION_HELD = f"""
SELECT g.name, g.label, {_SINCE.format('s')}, g.host, g.pid, g.session, COALESCE(w.waiting, 0)
FROM django_distlock_session_grant g
LEFT JOIN information_schema.PROCESSLIST s ON s.ID = g.session
LEFT JOIN (SELECT x.lk, count(*) AS waiting FROM ({_WAITS}) x GROUP BY x.lk) w
    ON w.lk = g.lk
WHERE g.name > %s AND g.name >= %s AND g.name < %s AND IS_USED_LOCK(g.lk) <=> g.session
ORDER BY g.name LIMIT %s"""
#: How many names are held in a range, up to a limit. Params: low, high, limit.
SESSION_COUNT = """
SELECT count(*) FROM (SELECT 1 FROM django_distlock_session_grant g
    WHERE g.name >= %s AND g.name < %s AND IS_USED_LOCK(g.lk) <=> g.session LIMIT %s) c"""
#: A lock's waiters, longest waiting first. Params: lock, limit. Rows: session, since when
#: it waits, statement (whose arguments carry the waiter's label, host and pid).
SESSION_WAITERS = f"""
SELECT w.ID, {_SINCE.format('w')}, w.INFO
FROM ({_WAITS}) w WHERE w.lk = %s ORDER BY w.TIME_MS DESC, w.ID LIMIT %s"""
#: End the session that holds a lock. Params: lock. Row: (ended,).
SESSION_FORCE = "CALL django_distlock_session_force(%s)"
