"""System checks of the database backend on MySQL and MariaDB: what in the settings or
the server's configuration breaks what the locks promise there (docs/database.md,
"MySQL and MariaDB"; docs/settings.md lists the ids).

The settings' checks run with every ``check``; the server's run with ``check --deploy``
(one round trip, as the Redis backend's eviction check does), since they need the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import connections

from .sql import TABLE

if TYPE_CHECKING:
    from .backend import DatabaseBackend

#: One round trip: the server's version and the settings the checks read. The engine of
#: the lock table is NULL before ``migrate``. Galera's ``wsrep_on`` is read from the
#: variables' table, where MySQL (which has no such variable) gives no row.
SERVER = f"""
SELECT @@version, @@innodb_rollback_on_timeout, @@innodb_flush_log_at_trx_commit,
    (SELECT engine FROM information_schema.tables
     WHERE table_schema = DATABASE() AND table_name = '{TABLE}'),
    (SELECT variable_value FROM information_schema.global_variables
     WHERE variable_name = 'WSREP_ON')"""
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
    """The server's configuration (one round trip on the backend's own connection)."""
    alias = backend.alias
    try:
        rows: list[Any] = backend.run(SERVER, [], "checking the server")
    except Exception as exc:  # reported, never raised: a check must not crash
        return [checks.Warning(
            f"DISTLOCK[{alias!r}]: could not read the MySQL server's settings: {exc}",
            obj=alias, id="distlock.W054")]
    version, rollback_on_timeout, flush, engine, wsrep = rows[0]
    messages: list[checks.CheckMessage] = []
    if _too_old(str(version)):
        messages.append(checks.Error(
            f"DISTLOCK[{alias!r}]: the server is {version}; the database backend needs "
            "MariaDB 10.6 or MySQL 8.0.1 or newer (SKIP LOCKED, NOWAIT).",
            obj=alias, id="distlock.E055"))
    if engine is not None and str(engine).lower() != "innodb":
        messages.append(checks.Error(
            f"DISTLOCK[{alias!r}]: the table {TABLE} is {engine}, which has no row locks "
            "and no transactions.",
            hint=f"ALTER TABLE {TABLE} ENGINE=InnoDB", obj=alias, id="distlock.E051"))
    if str(wsrep or "").upper() == "ON":
        if backend.mode == "lease":
            messages.append(checks.Error(
                f"DISTLOCK[{alias!r}]: the server is a Galera cluster node, which refuses "
                "the named locks lease mode queues its waiters on.",
                hint="Send lock traffic to one writer node, or use Redis or ZooKeeper.",
                obj=alias, id="distlock.E053"))
        else:
            messages.append(checks.Warning(
                f"DISTLOCK[{alias!r}]: the server is a Galera cluster node: row locks are "
                "each node's own, and a holder on another node fails only at its commit.",
                hint="Send lock traffic to one writer node.", obj=alias, id="distlock.W053"))
    if backend.mode == "transaction" and int(rollback_on_timeout or 0):
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: innodb_rollback_on_timeout is ON: an acquire that times "
            "out rolls back the whole transaction around it, not only its own statement.",
            hint="Turn it off (the default).", obj=alias, id="distlock.W052"))
    if int(flush) != 1:
        messages.append(checks.Warning(
            f"DISTLOCK[{alias!r}]: innodb_flush_log_at_trx_commit is {flush}: a crash of "
            "the machine may lose granted leases and give a fencing token again.",
            hint="Set it to 1 (the default).", obj=alias, id="distlock.W055"))
    return messages


def _too_old(version: str) -> bool:
    """Whether a ``@@version`` string names a server older than the oldest served."""
    numbers = []
    for part in version.split("-")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits or 0))
    found = tuple(numbers)
    return found < (OLDEST_MARIADB if "mariadb" in version.lower() else OLDEST_MYSQL)

