"""The database backend's class: what both modes share (options, vendor, errors, checks)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import connections

from ...exceptions import InvalidBackendOptions, UnsupportedOperation
from ..base import BaseLockBackend, check_option_keys
from .errors import DATABASE_ERRORS, ERRORS, MIGRATE, connection_lost
from .mysql_checks import server_checks, settings_checks
from .mysql_sql import MYSQL
from .sessions import SessionFactory, ThreadSessions
from .sql import POSTGRESQL, SQLITE, TABLE, Dialect

_OPTION_KEYS = frozenset({"DATABASE", "MODE", "PREPARE", "ASYNC_SESSIONS"})
#: Longest wait sent to the server in one call (PostgreSQL's ``lock_timeout`` stops
#: at about 24.8 days); a longer timeout waits in several calls.
MAX_SERVER_WAIT = 86400.0
_HEALTH = f"SELECT 1 FROM {TABLE} LIMIT 0"  # resolves the table, reads no row


#: Django's vendors the database backend serves (each in both modes), as the docs, the
#: errors and the admin name them.
VENDOR_NAMES = {"postgresql": "PostgreSQL", "sqlite": "SQLite", "mysql": "MySQL/MariaDB"}


class DatabaseBackend(BaseLockBackend):
    """Locks as rows of ``django_distlock_lock``, on PostgreSQL, SQLite, or MySQL and
    MariaDB (InnoDB).

    ``OPTIONS``: ``DATABASE`` (alias in ``DATABASES``, default ``"default"``),
    ``MODE`` (``"lease"``, the default, or ``"transaction"``: the class built is
    :class:`~.lease.LeaseBackend` or :class:`~.transaction.TransactionBackend`),
    ``PREPARE`` (PostgreSQL lease statements as prepared statements, default
    True; False behind a pooler that cannot keep them), ``ASYNC_SESSIONS``
    (PostgreSQL lease mode: connections that asyncio tasks of one event loop
    use at most at a time, each from its first attempt to its release;
    default 16).
    """

    errors = DATABASE_ERRORS
    supports_fencing = True
    distributed = True

    #: ``OPTIONS["MODE"]`` → the class that serves it (filled by the subclasses).
    modes: ClassVar[dict[str, type[DatabaseBackend]]] = {}
    mode: ClassVar[str]

    def __init_subclass__(cls, mode: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if mode:
            cls.mode = mode
            DatabaseBackend.modes[mode] = cls

    def __new__(cls, alias: str, params: Mapping[str, Any]) -> DatabaseBackend:
        if cls is DatabaseBackend:
            options = params.get("OPTIONS") or {}
            mode = options.get("MODE", "lease") if isinstance(options, Mapping) else "lease"
            if mode not in cls.modes:
                raise InvalidBackendOptions(
                    f"DISTLOCK[{alias!r}]['OPTIONS']['MODE'] must be one of "
                    f"{sorted(cls.modes)}, got {mode!r}."
                )
            database = options.get("DATABASE", "default") if isinstance(options, Mapping) else ""
            vendor = connections[database].vendor if database in settings.DATABASES else ""
            cls = cls.modes[mode].for_vendor(vendor)
        return super().__new__(cls)

    @classmethod
    def for_vendor(cls, vendor: str) -> type[DatabaseBackend]:
        """The class that serves this mode on ``vendor`` (capabilities may differ)."""
        return cls

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        check_option_keys(alias, self.options, _OPTION_KEYS)
        self.database: str = self.options.get("DATABASE", "default")
        if not isinstance(self.database, str):
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['DATABASE'] must be a str."
            )
        #: What an error message calls this backend's database (``errors.translate``'s
        #: ``where``).
        self.where = f"Database {self.database!r} (lock alias {alias!r})"
        if self.database not in settings.DATABASES:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['DATABASE'] is {self.database!r}, which is "
                f"not an alias of DATABASES ({sorted(settings.DATABASES)})."
            )
        prepare = self.options.get("PREPARE", True)
        if not isinstance(prepare, bool):
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['PREPARE'] must be True or False."
            )
        async_sessions = self.options.get("ASYNC_SESSIONS", 16)
        if isinstance(async_sessions, bool) or not isinstance(async_sessions, int) or not (
            1 <= async_sessions <= 1000
        ):
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['ASYNC_SESSIONS'] must be an int from 1 to 1000."
            )
        self.async_sessions: int = async_sessions
        self.session_factory = SessionFactory(self.database, prepare)
        self.sessions = ThreadSessions(self.session_factory)

    # -- vendor -----------------------------------------------------------------

    @cached_property
    def vendor(self) -> str:
        """The database vendor: ``"postgresql"``, ``"sqlite"`` or ``"mysql"`` (no I/O)."""
        return connections[self.database].vendor

    @property
    def vendor_name(self) -> str:
        """The vendor as people name it: "PostgreSQL", "SQLite", "MySQL/MariaDB" (no I/O)."""
        return VENDOR_NAMES.get(self.vendor, self.vendor)

    @cached_property
    def own_sessions(self) -> bool:
        """Whether statements apart from the caller's transaction run on the backend's own
        connections (PostgreSQL, MySQL) rather than on Django's (SQLite: one writer at a
        time, whose transaction a lease joins)."""
        return self.vendor in ("postgresql", "mysql")

    @cached_property
    def dialect(self) -> Dialect:
        if self.vendor == "postgresql":
            return POSTGRESQL
        if self.vendor == "sqlite":
            return SQLITE
        if self.vendor == "mysql":
            return MYSQL
        raise UnsupportedOperation(
            f"The database backend serves PostgreSQL, SQLite, MySQL and MariaDB, not "
            f"{self.vendor!r} (DATABASES[{self.database!r}])."
        )

    # -- running statements -------------------------------------------------------

    def run(self, statement: str, params: Any, doing: str, fetch: bool = True) -> list[Any]:
        """Run one statement apart from the caller's transaction (PostgreSQL, MySQL: on
        this thread's session; SQLite: on Django's connection) and return its rows.

        :raises BackendUnavailable: when the database fails.
        """
        try:
            if not self.own_sessions:
                with connections[self.database].cursor() as cursor:
                    cursor.execute(statement, params)
                    return cursor.fetchall() if fetch else []
            return self._run_on_session(statement, params, fetch)
        except ERRORS as exc:
            if not self.own_sessions or not connection_lost(exc):
                raise self.errors.translate(exc, doing, self.where) from exc
        # This thread's session was gone (terminated, the server restarted): once more on
        # a new one, as the lease calls do.
        with self.errors.translating(doing, self.where):
            return self._run_on_session(statement, params, fetch)

    def _run_on_session(self, statement: str, params: Any, fetch: bool) -> list[Any]:
        """Run one statement on this thread's session; a failure forgets the session."""
        try:
            session = self.sessions.get()
            with session.mutex:
                cursor = session.execute(statement, params)
                return cursor.fetchall() if fetch else []
        except ERRORS:
            self.sessions.forget()
            raise

    def health(self) -> float:
        started = time.perf_counter()
        # Reads the lock table, not just the server: where ``migrate`` never ran, every
        # acquire fails, and so must this (with the hint to migrate).
        self.run(_HEALTH, [], "checking health")
        return time.perf_counter() - started

    def prune(self, idle_for: float = 3600, batch: int = 1000, wait: float = 10.0) -> int:
        """Delete the rows of names idle for ``idle_for`` seconds (no holder, no waiter's
        reservation, no reader or permit), ``batch`` per transaction; a name used again
        gets a new row whose fencing tokens start above every pruned row's
        (docs/database.md, "Pruning idle rows").

        :param idle_for: seconds since the row was last held (granted, or its lease ended).
        :param batch: rows deleted per transaction.
        :param wait: PostgreSQL: seconds to keep trying for the prune's lock while rows
            are being created (it never makes them wait).
        :returns: the number of rows deleted.
        :raises ValueError: on a bad argument.
        :raises TransactionManagementError: SQLite, inside an atomic block.
        :raises BackendUnavailable: when the database fails, or the lock stayed taken.
        """
        from .prune import prune  # the prune's SQL is only needed here

        return prune(self, idle_for, batch, wait)

    def close(self) -> None:
        self.session_factory.close_all()
        self.sessions.reset()

    # -- checks -------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        if kwargs.get("deploy"):
            if self.database in settings.DATABASES and self.vendor == "mysql":
                return server_checks(self)  # the server's settings: one round trip
            return []
        alias, db = self.alias, self.database
        if db not in settings.DATABASES:
            return [
                checks.Error(
                    f"DISTLOCK[{alias!r}] uses database {db!r}, which is not in DATABASES.",
                    obj=alias,
                    id="distlock.E003",
                )
            ]
        messages = self._vendor_checks()
        if not apps.is_installed("django_distlock"):
            messages.append(
                checks.Error(
                    f"DISTLOCK[{alias!r}] uses the database backend, whose table comes with "
                    "the 'django_distlock' app.",
                    hint=f"Add 'django_distlock' to INSTALLED_APPS and {MIGRATE}.",
                    obj=alias,
                    id="distlock.E005",
                )
            )
        return messages

    def _vendor_checks(self) -> list[checks.CheckMessage]:
        alias, db, vendor = self.alias, self.database, self.vendor
        if vendor not in VENDOR_NAMES:
            return [
                checks.Error(
                    f"DISTLOCK[{alias!r}]: the database backend serves PostgreSQL, SQLite, "
                    f"MySQL and MariaDB; DATABASES[{db!r}] is {vendor!r}.",
                    hint="Use another database alias.",
                    obj=alias,
                    id="distlock.E004",
                )
            ]
        messages: list[checks.CheckMessage] = []
        if vendor == "mysql":
            messages.extend(settings_checks(self))
        if vendor == "sqlite":
            if sqlite3.sqlite_version_info < (3, 35, 0):
                messages.append(
                    checks.Error(
                        f"DISTLOCK[{alias!r}] needs SQLite 3.35 or newer (RETURNING and "
                        f"upserts); this Python has {sqlite3.sqlite_version}.",
                        obj=alias,
                        id="distlock.E004",
                    )
                )
            name = str(settings.DATABASES[db].get("NAME", ""))
            if name in ("", ":memory:") or "mode=memory" in name:
                messages.append(
                    checks.Warning(
                        f"DISTLOCK[{alias!r}] uses an in-memory SQLite database, which no "
                        "other process can see: its locks exclude nothing across processes.",
                        obj=alias,
                        id="distlock.W001",
                    )
                )
        return messages


def server_wait(deadline: float | None) -> float:
    """Seconds the next call may wait in the server: until ``deadline``, at most
    :data:`MAX_SERVER_WAIT` (None: no deadline, also capped)."""
    if deadline is None:
        return MAX_SERVER_WAIT
    return max(min(deadline - time.monotonic(), MAX_SERVER_WAIT), 0.0)
