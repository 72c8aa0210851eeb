"""How the database fails, and what each failure becomes (:data:`DATABASE_ERRORS`, the
backend's ``errors``), with the classifications the backend acts on before it translates:
:func:`is_busy` (held by someone else, or not in time: a miss, not a failure),
:func:`connection_lost` (the session is gone: once more on a new one) and
:func:`session_ended` (transaction mode: the holding transaction was rolled back).

The client boundary is where a statement runs (``DatabaseBackend.run()``, the lease
mode's ``_call()`` and attempts, the share statements, the transaction mode's
``_take()``): it catches :data:`ERRORS`, classifies where a failure may mean something
else, cleans up (forgets or closes a session) and raises
``DATABASE_ERRORS.translate(exc, doing, backend.where) from exc``.
"""

from __future__ import annotations

import contextlib
import sqlite3

from django.db import DatabaseError, Error

from ...exceptions import BackendUnavailable, Deadlock, DistLockError, LockConfigurationError
from ..base import ErrorMap


def _client_errors() -> tuple[type[BaseException], ...]:
    """Django's database errors and the raw drivers' (lease statements on PostgreSQL)."""
    errors: list[type[BaseException]] = [Error]
    for module in ("psycopg", "psycopg2", "MySQLdb"):
        with contextlib.suppress(ImportError):
            errors.append(__import__(module).Error)
    return tuple(errors)


#: What a database call may raise that means "the server or the connection failed".
ERRORS = _client_errors()

MIGRATE = "run `manage.py migrate django_distlock`"
#: SQLSTATEs of a session the server ended (admin_shutdown, crash_shutdown, ...).
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03", "57P05"})


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (psycopg 3 or 2), looking through Django's wrapper."""
    for err in (exc, exc.__cause__):
        code = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if code:
            return str(code)
    return None


#: MySQL and MariaDB error numbers of a lock wait that ended without the lock: a lock
#: wait timeout (also MariaDB's NOWAIT), MySQL 8's NOWAIT, a statement stopped by
#: MariaDB's max_statement_time or MySQL's MAX_EXECUTION_TIME, or by KILL QUERY.
_MYSQL_BUSY = frozenset({1205, 3572, 1969, 3024, 1317})
#: MySQL and MariaDB error numbers of a connection that is gone or cannot be made: the
#: client's (server gone away, lost during a query, cannot connect) and the server's (a
#: killed connection, a shutdown, an idle connection closed).
_MYSQL_LOST = frozenset({2002, 2003, 2006, 2013, 2055, 1053, 1927, 4031})


def mysql_errno(exc: BaseException) -> int | None:
    """The error number of a MySQLdb error, looking through Django's wrapper (which keeps
    the driver's arguments); None for another driver's."""
    for err in (exc, exc.__cause__):
        if err is not None and type(err).__module__.split(".")[0] == "MySQLdb":
            code = err.args[0] if err.args else None
            return code if isinstance(code, int) else None
    return None


def is_busy(exc: BaseException) -> bool:
    """Whether a database error means "held by someone else, or not in time" rather than
    a failure: a lock wait or a statement that ran out of time."""
    if sqlstate(exc) in ("55P03", "57014"):  # lock_not_available, query_canceled
        return True
    if mysql_errno(exc) in _MYSQL_BUSY:
        return True
    message = str(exc).lower()
    return isinstance(exc, DatabaseError) and (
        "database is locked" in message or "database table is locked" in message
    )


def statement_cancelled(exc: BaseException) -> bool:
    """Whether a statement failed because it was stopped on request (PostgreSQL's cancel,
    MySQL's ``KILL QUERY``)."""
    return sqlstate(exc) == "57014" or mysql_errno(exc) == 1317


def row_wait_timed_out(exc: BaseException) -> bool:
    """Whether a statement failed only for waiting too long for another transaction's
    row lock (PostgreSQL's lock_timeout, InnoDB's innodb_lock_wait_timeout)."""
    return sqlstate(exc) == "55P03" or mysql_errno(exc) == 1205


#: SQLSTATEs of a transaction the database refused as a whole, which a retry may win:
#: serialization_failure (REPEATABLE READ, SERIALIZABLE) and deadlock_detected.
_REFUSED_SQLSTATES = frozenset({"40001", "40P01"})


def transaction_refused(exc: BaseException) -> bool:
    """Whether the database rolled the whole transaction back and a retry of it may win:
    a serialization failure or a deadlock (PostgreSQL's SQLSTATEs, MySQL's 1213)."""
    return sqlstate(exc) in _REFUSED_SQLSTATES or mysql_errno(exc) == 1213


def is_deadlock(exc: BaseException) -> bool:
    """Whether a lock wait was refused as a deadlock: PostgreSQL's 40P01 (an advisory
    lock's wait, a row lock's), MySQL's 3058 (``GET_LOCK``) and 1213 (InnoDB's row locks,
    MariaDB's ``GET_LOCK``)."""
    return sqlstate(exc) == "40P01" or mysql_errno(exc) in (3058, 1213)


def refused_wait(where: str, name: str, alias: str, exc: BaseException) -> Deadlock:
    """The error for a wait for ``name`` the server refused as closing a cycle of waits
    (:func:`is_deadlock`; raise it ``from`` the driver's error)."""
    return Deadlock(
        f"{where}: waiting for {name!r} would deadlock: the server found a cycle of "
        f"sessions each waiting for a lock another holds ({exc}).", name=name, alias=alias,
    )


def is_duplicate(exc: BaseException) -> bool:
    """Whether a database error is a unique key's violation (a row made meanwhile)."""
    return sqlstate(exc) == "23505" or mysql_errno(exc) == 1062


def connection_lost(exc: BaseException | None) -> bool:
    """Whether a database error says the connection is gone (its session ended, the
    server restarted): its locks went with it, and a new connection may succeed."""
    if exc is None:
        return False
    code = sqlstate(exc)
    if code is not None:
        return code.startswith("08") or code in _SESSION_ENDED
    errno = mysql_errno(exc)
    if errno is not None:  # a server's error, or the client's: the number says which
        return errno in _MYSQL_LOST
    # psycopg raises a connection's failures client-side, without a SQLSTATE.
    return any(
        type(err).__name__ in ("OperationalError", "InterfaceError")
        and type(err).__module__.split(".")[0] in ("psycopg", "psycopg2", "django")
        for err in (exc, exc.__cause__)
    )


def session_ended(exc: BaseException) -> bool:
    """Whether ``exc`` says the session that held a transaction is gone (the server then
    rolled the transaction back and freed its row locks); never on SQLite, whose
    "connection" is a file."""
    if isinstance(exc, sqlite3.Error) or isinstance(exc.__cause__, sqlite3.Error):
        return False
    return connection_lost(exc)


class DatabaseErrors(ErrorMap):
    """Every database error is :class:`BackendUnavailable`, with what to do when the
    schema is missing: an undefined function (SQLSTATE 42883) lacks the procedures, an
    undefined table (42P01, SQLite's "no such table", MySQL's 1146) the app's tables; both say to
    migrate. ``where`` names the database and the lock alias (``backend.where``)."""

    def translate(
        self, exc: BaseException, doing: str = "", where: str = ""
    ) -> DistLockError | LockConfigurationError:
        code = sqlstate(exc)
        message = str(exc)
        if code == "42883" or mysql_errno(exc) == 1305:  # undefined function, procedure
            hint = f" The database lacks django-distlock's procedures: {MIGRATE}."
        elif code == "42P01" or "no such table" in message or mysql_errno(exc) == 1146:
            hint = (
                " The lock table is missing: add 'django_distlock' to INSTALLED_APPS and "
                f"{MIGRATE}."
            )
        else:
            hint = ""
        during = f" while {doing}" if doing else ""
        return BackendUnavailable(f"{where or 'The database'} failed{during}: {message}{hint}")


def did_not_answer(where: str) -> BackendUnavailable:
    """The error for a statement whose connection the watchdog cut: the database did not
    answer by the call's deadline (raise it ``from`` the client's error)."""
    return BackendUnavailable(f"{where} did not answer within the timeout; its connection "
                              "was cut.")


#: The database backend's error map (``DatabaseBackend.errors``).
DATABASE_ERRORS = DatabaseErrors(ERRORS)
