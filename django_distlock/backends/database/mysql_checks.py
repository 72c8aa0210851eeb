"""System checks of the database backend on MySQL and MariaDB: what in the settings or
the server's configuration breaks what the locks promise there (docs/database.md,
"MySQL and MariaDB"; docs/settings.md lists the ids).

The settings' checks run with every ``check``; the server's run with ``check --deploy``
(two round trips, as the Redis backend's eviction check asks its server), since they need
the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import connections

from ...exceptions import BackendUnavailable
from .errors import mysql_errno
from .sql import TABLE

if TYPE_CHECKING:
    from .backend import DatabaseBackend

#: The server's variables the checks read: a statement both servers answer, where a
#: variable one of them lacks (Galera's on MySQL, Group Replication's on MariaDB) gives no
#: row. (MySQL 8 has no ``information_schema.global_variables``.)
VARIABLES = """
SHOW GLOBAL VARIABLES WHERE Variable_name IN ('version', 'innodb_rollback_on_timeout',
    'innodb_flush_log_at_trx_commit', 'wsrep_on', 'wait_timeout', 'log_bin', 'binlog_format',
    'group_replication_group_name', 'group_replication_single_primary_mode',
    'super_read_only', 'sync_binlog', 'tcp_keepalive_time')"""
#: Whether the backend's user may keep its rows of ``MEMORY`` tables out of the binary log
#: (sql/mysql.sql: ``django_distlock_session_open``, ``django_distlock_wait``): a change
#: of nothing, refused (1227) without the privilege that setting ``sql_log_bin`` needs.
SKIP_LOG = "SET SESSION sql_log_bin = @@session.sql_log_bin"
#: The ``MEMORY`` tables whose rows the server would replicate (``W064``): the holders of
#: session mode, the waiters of lease mode.
MEMORY_ROWS = {"session": "django_distlock_session_grant", "lease": "django_distlock_waiter"}
#: The lock table's engine (no row before ``migrate``).
ENGINE = f"""
SELECT engine FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = '{TABLE}'"""
#: Below this many seconds of ``wait_timeout`` the server closes the backend's sessions
#: between a lease's calls, and the bells of their grants with them.
SHORTEST_WAIT_TIMEOUT = 600
#: Past this many idle seconds before the server's first TCP keepalive probe (MariaDB's
#: ``tcp_keepalive_time``; 0: the OS default, two hours), a session-mode holder whose
#: machine vanished keeps its lock that long.
LONGEST_KEEPALIVE_IDLE = 60
#: The modes that take named locks (GET_LOCK), which are each server's own.
NAMED_LOCK_MODES = ("lease", "session")
#: The oldest servers served: SKIP LOCKED (listing, prune) and NOWAIT.
OLDEST_MARIADB = (10, 6)
OLDEST_MYSQL = (8, 0, 1)


def settings_checks(backend: DatabaseBackend) -> list[checks.CheckMessage]:
    """The alias' database settings (no I/O)."""
    alias = backend.alias
    options = connections[backend.database].settings_dict.get("OPTIONS") or {}
    messages: list[checks.CheckMessage] = []
    isolation = str(options.get("isolation_level") or "").lower()
    if backend.mode == "transaction" and isolation == "read uncommitted":
        messages.append(checks.Error(
            f"DISTLOCK[{alias!r}]: transaction mode on DATABASES[{backend.database!r}] with "
            "isolation_level 'read uncommitted': the locked block may read rows that are "
            "never committed.",
            hint="Use Django's default, 'read committed'.", obj=alias, id="distlock.E050"))
    elif backend.mode == "transaction" and isolation in ("repeatable read", "serializable"):
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: transaction mode with isolation_level {isolation!r}: "
            "what the block read before the acquire stays its snapshot after it, so a "
            "stock read before taking the lock can oversell.",
            hint="Acquire before reading, or use 'read committed' (Django's default).",
            obj=alias, id="distlock.W050"))
    charset = str(options.get("charset") or "utf8mb4").lower()
    if charset != "utf8mb4":
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: DATABASES[{backend.database!r}] connects with charset "
            f"{charset!r}: a lock name with a character outside it fails.",
            hint="Set OPTIONS['charset'] to 'utf8mb4' (Django's default).",
            obj=alias, id="distlock.W057"))
    return messages


def server_checks(backend: DatabaseBackend) -> list[checks.CheckMessage]:
    """The server's configuration (two round trips on the backend's own connection)."""
    alias = backend.alias
    try:
        rows: list[Any] = backend.run(VARIABLES, [], "checking the server")
        engines: list[Any] = backend.run(ENGINE, [], "checking the server")
    except Exception as exc:  # reported, never raised: a check must not crash
        return [_unread(alias, exc)]
    found = {str(name).lower(): value for name, value in rows}
    engine = engines[0][0] if engines else None
    if backend.mode in MEMORY_ROWS and _on(found.get("log_bin")):
        try:
            backend.run(SKIP_LOG, [], "checking the server", fetch=False)
            found["skips_log"] = True
        except BackendUnavailable as exc:
            if exc.__cause__ is None or mysql_errno(exc.__cause__) != 1227:
                return [_unread(alias, exc)]
            found["skips_log"] = False
    return checks_of(backend, found, engine)


def _unread(alias: str, exc: Exception) -> checks.CheckMessage:
    return checks.Warning(
        f"DISTLOCK[{alias!r}]: could not read the MySQL server's settings: {exc}",
        obj=alias, id="distlock.W054")


def checks_of(backend: DatabaseBackend, found: dict[str, Any],
              engine: str | None) -> list[checks.CheckMessage]:
    """What the server's variables ``found`` (by lower-case name; a variable the server
    lacks is absent) and the lock table's ``engine`` tell about ``backend``."""
    alias = backend.alias
    version = str(found.get("version", ""))
    messages: list[checks.CheckMessage] = []
    if _too_old(version):
        messages.append(checks.Error(
            f"DISTLOCK[{alias!r}]: the server is {version}; the database backend needs "
            "MariaDB 10.6 or MySQL 8.0.1 or newer (SKIP LOCKED, NOWAIT).",
            obj=alias, id="distlock.E055"))
    if engine is not None and str(engine).lower() != "innodb":
        messages.append(checks.Error(
            f"DISTLOCK[{alias!r}]: the table {TABLE} is {engine}, which has no row locks "
            "and no transactions.",
            hint=f"ALTER TABLE {TABLE} ENGINE=InnoDB", obj=alias, id="distlock.E051"))
    named_locks = backend.mode in NAMED_LOCK_MODES
    if str(found.get("wsrep_on", "")).upper() == "ON":
        if named_locks:
            messages.append(checks.Error(
                f"DISTLOCK[{alias!r}]: the server is a Galera cluster node, which refuses "
                f"the named locks {backend.mode} mode takes (GET_LOCK).",
                hint="Send lock traffic to one writer node, or use Redis or ZooKeeper.",
                obj=alias, id="distlock.E053"))
        else:
            messages.append(checks.Warning(
                f"DISTLOCK[{alias!r}]: the server is a Galera cluster node: row locks are "
                "each node's own, and a holder on another node fails only at its commit.",
                hint="Send lock traffic to one writer node.", obj=alias, id="distlock.W053"))
    messages.extend(_group_replication(backend, found))
    if backend.mode == "transaction" and _on(found.get("innodb_rollback_on_timeout")):
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: innodb_rollback_on_timeout is ON: an acquire that times "
            "out rolls back the whole transaction around it, not only its own statement.",
            hint="Turn it off (the default).", obj=alias, id="distlock.W052"))
    flush = found.get("innodb_flush_log_at_trx_commit", "1")
    if str(flush) != "1":
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: innodb_flush_log_at_trx_commit is {flush}: a crash of "
            "the machine may lose granted leases and give a fencing token again.",
            hint="Set it to 1 (the default).", obj=alias, id="distlock.W055"))
    wait_timeout = int(found.get("wait_timeout") or SHORTEST_WAIT_TIMEOUT)
    if backend.mode == "lease" and wait_timeout < SHORTEST_WAIT_TIMEOUT:
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: wait_timeout is {wait_timeout} s: the server closes the "
            "backend's idle sessions, and a grant's bell with its session, so a waiter "
            "learns of that lease's release only at its next look (each second), and the "
            "next call reconnects.",
            hint=f"Set wait_timeout to {SHORTEST_WAIT_TIMEOUT} or more (the default is "
            "28800).", obj=alias, id="distlock.W056"))
    if _on(found.get("log_bin")) and str(found.get("binlog_format", "")).upper() == "STATEMENT":
        messages.append(checks.Error(
            f"DISTLOCK[{alias!r}]: the binary log is on with binlog_format STATEMENT, which "
            "takes no InnoDB row written at READ COMMITTED, the isolation level of the "
            "backend's own sessions: the server refuses their writes (error 1665), so "
            f"{backend.mode} mode grants no lock.",
            hint="Use binlog_format ROW (MySQL 8's default) or MIXED (MariaDB's).",
            obj=alias, id="distlock.E056"))
    table = MEMORY_ROWS.get(backend.mode)
    if table is not None and _on(found.get("log_bin")) and not found.get("skips_log"):
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: the binary log is on, and the backend's user may not keep "
            f"the rows of {table}, a MEMORY table, out of it: a replica stops replicating "
            "(error 1032) at a replicated update or delete of such a row it lacks, one it "
            "lost when it restarted, or one a session of a user that may keep them out "
            "of the log wrote.",
            hint=f"On each replica, set replicate_ignore_table to <database>.{table} (its "
            "rows are the primary's sessions and mean nothing there). Giving the backend's "
            "user BINLOG ADMIN (MariaDB) or SESSION_VARIABLES_ADMIN (MySQL 8) keeps them "
            "out of the log too, where every process of the site uses that user.",
            obj=alias, id="distlock.W064"))
    if backend.mode == "session":
        messages.extend(_session_mode(backend, found))
    return messages


def _session_mode(backend: DatabaseBackend, found: dict[str, Any]) -> list[checks.CheckMessage]:
    """Session mode: a grant's write to the binary log, and how long a vanished holder
    keeps its lock (docs/database.md, "Session mode on MySQL and MariaDB")."""
    alias = backend.alias
    messages: list[checks.CheckMessage] = []
    if (_on(found.get("log_bin")) and str(found.get("sync_binlog", "0")) == "1"
            and not found.get("skips_log")):
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: the binary log is on with sync_binlog=1: a session-mode "
            "grant that writes its holder's row (a session's first grant of a name by a "
            "holder) has it logged and flushed to disk: a disk flush.",
            hint="A database user that may set sql_log_bin (BINLOG ADMIN on MariaDB, "
            "SESSION_VARIABLES_ADMIN on MySQL 8) keeps its sessions' holder rows out of the "
            "log. Lease and transaction mode commit rows, flushed the same way, and cost "
            "more there (docs/database.md, session mode on MySQL and MariaDB).",
            obj=alias, id="distlock.W061"))
    idle = found.get("tcp_keepalive_time")  # MariaDB's; MySQL 8 has none
    if idle is not None and not 0 < int(idle) <= LONGEST_KEEPALIVE_IDLE:
        shown = "0 (the OS default, about two hours)" if int(idle) == 0 else f"{idle} s"
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: tcp_keepalive_time is {shown}: a session-mode holder "
            "whose machine or network vanished keeps its lock until the server's keepalives "
            "give up.",
            hint="Set tcp_keepalive_time=5, tcp_keepalive_interval=1, tcp_keepalive_probes=3 "
            "in the server's configuration (about 8 s, as PostgreSQL's sessions set theirs).",
            obj=alias, id="distlock.W062"))
    return messages


def _group_replication(backend: DatabaseBackend,
                       found: dict[str, Any]) -> list[checks.CheckMessage]:
    """MySQL Group Replication (a member has a group name): named locks are each member's
    own, and a member's row locks do not stop another member's grant (the loser fails at
    its commit)."""
    if not found.get("group_replication_group_name"):
        return []
    alias = backend.alias
    if _on(found.get("super_read_only")):
        return [checks.Error(
            f"DISTLOCK[{alias!r}]: the server is a read-only member of a replication group "
            "(a secondary): every grant's write fails.",
            hint="Connect to the group's primary.", obj=alias, id="distlock.E054")]
    if _on(found.get("group_replication_single_primary_mode", "ON")):
        return []
    if backend.mode in NAMED_LOCK_MODES:
        return [checks.Error(
            f"DISTLOCK[{alias!r}]: the server is a member of a multi-primary replication "
            f"group: the named locks {backend.mode} mode takes are each member's own, and "
            "two members could grant one name at once.",
            hint="Use single-primary mode (the default), or Redis or ZooKeeper.",
            obj=alias, id="distlock.E054")]
    return [checks.Warning(
        f"DISTLOCK[{alias!r}]: the server is a member of a multi-primary replication group: "
        "row locks are each member's own, and a holder on another member fails only at its "
        "commit.", hint="Use single-primary mode (the default).", obj=alias,
        id="distlock.W060")]


def _on(value: Any) -> bool:
    """Whether a server variable's value (``ON``, ``1``; absent: None) is on."""
    return str(value or "").upper() in ("ON", "1")


def _too_old(version: str) -> bool:
    """Whether a ``@@version`` string names a server older than the oldest served."""
    numbers = []
    for part in version.split("-")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits or 0))
    found = tuple(numbers)
    return found < (OLDEST_MARIADB if "mariadb" in version.lower() else OLDEST_MYSQL)

