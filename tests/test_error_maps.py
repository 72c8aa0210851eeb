"""Each backend's error map (``backends/<backend>/errors.py``, the class attribute
``errors``): every client exception class it declares becomes the error the map says,
with the hint a user acts on, chained to the client's error (issue 33, item 5).

The client exceptions are the drivers' own classes, built here as the drivers build
them; what a real server makes a client raise, and what the backends do with it, is the
fault suites' (test_failures, test_redis_faults, test_zookeeper_faults,
test_waiter_faults, test_hostile)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import django.db
import django.db.utils
import MySQLdb
import psycopg
import psycopg.errors
import pytest
import redis.exceptions
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoAuthError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from pymemcache.exceptions import (
    MemcacheServerError,
    MemcacheUnexpectedCloseError,
    MemcacheUnknownCommandError,
)

from django_distlock.backends.base import BaseLockBackend, ErrorMap
from django_distlock.backends.cache import CacheBackend
from django_distlock.backends.cache.errors import CACHE_ERRORS
from django_distlock.backends.database import DatabaseBackend
from django_distlock.backends.database.errors import (
    DATABASE_ERRORS,
    connection_lost,
    is_busy,
    session_ended,
    transaction_refused,
)
from django_distlock.backends.locmem import LocMemBackend
from django_distlock.backends.redis import RedisBackend
from django_distlock.backends.redis.errors import REDIS_ERRORS
from django_distlock.backends.redis.redlock import RedlockBackend
from django_distlock.backends.zookeeper import ZooKeeperBackend
from django_distlock.backends.zookeeper.errors import ZOOKEEPER_ERRORS
from django_distlock.exceptions import BackendUnavailable, LockConfigurationError

from .conftest import require_redis
from .private_redis import Server

WHERE = "Database 'default' (lock alias 'pg')"


def translated(errors: ErrorMap, exc: BaseException, doing: str = "",
               where: str = "") -> BaseException:
    """What ``exc`` raised in ``errors.translating(doing, where)`` comes out as."""
    with pytest.raises(Exception) as info, errors.translating(doing, where):
        raise exc
    return info.value


def _django_wrapped(exc: BaseException) -> django.db.Error:
    """``exc`` as Django's ``DatabaseErrorWrapper`` raises it: Django's class of the first
    of these names that the driver's error is, chained to it."""
    driver = MySQLdb if isinstance(exc, MySQLdb.Error) else psycopg
    for name in ("DataError", "OperationalError", "IntegrityError", "InternalError",
                 "ProgrammingError", "NotSupportedError", "DatabaseError", "InterfaceError",
                 "Error"):
        if isinstance(exc, getattr(driver, name)):
            wrapped: django.db.Error = getattr(django.db.utils, name)(*exc.args)
            wrapped.__cause__ = exc
            return wrapped
    raise AssertionError(f"not a psycopg or MySQLdb error: {exc!r}")


@pytest.mark.parametrize("cls, errors", [
    (DatabaseBackend, DATABASE_ERRORS),
    (RedisBackend, REDIS_ERRORS),
    (RedlockBackend, REDIS_ERRORS),
    (ZooKeeperBackend, ZOOKEEPER_ERRORS),
    (CacheBackend, CACHE_ERRORS),
])
def test_each_backend_declares_its_map(cls: type[BaseLockBackend], errors: ErrorMap) -> None:
    assert cls.errors is errors
    assert errors.client


def test_a_backend_without_a_client_catches_nothing() -> None:
    assert LocMemBackend.errors is BaseLockBackend.errors
    assert BaseLockBackend.errors.client == ()
    with pytest.raises(OSError), BaseLockBackend.errors.translating("anything"):
        raise OSError("not a client's")


# -- database ------------------------------------------------------------------------

@pytest.mark.parametrize("exc, hint", [
    (psycopg.errors.UndefinedFunction("function distlock_acquire() does not exist"),
     "lacks django-distlock's procedures: run `manage.py migrate django_distlock`"),
    (psycopg.errors.UndefinedTable('relation "django_distlock_lock" does not exist'),
     "The lock table is missing: add 'django_distlock' to INSTALLED_APPS and run "
     "`manage.py migrate django_distlock`"),
    (django.db.OperationalError("no such table: django_distlock_lock"),
     "The lock table is missing"),
    (psycopg.OperationalError("connection refused"), "connection refused"),
    (psycopg.errors.AdminShutdown("terminating connection"), "terminating connection"),
    (django.db.InterfaceError("connection already closed"), "connection already closed"),
    (MySQLdb.ProgrammingError(1146, "Table 'distlock.django_distlock_lock' doesn't exist"),
     "The lock table is missing"),
    (MySQLdb.OperationalError(1305, "PROCEDURE distlock.django_distlock_wait does not exist"),
     "lacks django-distlock's procedures"),
])
def test_the_database_map(exc: BaseException, hint: str) -> None:
    drivers = (psycopg.Error, MySQLdb.Error)
    for raised in (exc, _django_wrapped(exc) if isinstance(exc, drivers) else exc):
        error = translated(DATABASE_ERRORS, raised, "acquiring a lock", WHERE)
        assert type(error) is BackendUnavailable
        assert str(error).startswith(f"{WHERE} failed while acquiring a lock: ")
        assert hint in str(error)
        assert error.__cause__ is raised


@pytest.mark.parametrize("exc, busy, lost, ended", [
    (psycopg.errors.LockNotAvailable("could not obtain lock"), True, False, False),
    (psycopg.errors.QueryCanceled("canceling statement"), True, False, False),
    (django.db.OperationalError("database is locked"), True, True, False),
    (psycopg.errors.AdminShutdown("terminating connection"), False, True, True),
    (psycopg.errors.ConnectionFailure("connection failure"), False, True, True),
    (psycopg.OperationalError("server closed the connection"), False, True, True),
    (psycopg.errors.UndefinedTable("no relation"), False, False, False),
    (sqlite3.OperationalError("disk I/O error"), False, False, False),
    # MySQL and MariaDB (the numbers MariaDB 10.11 gave, docs/plans/issue-34.md, §13): a
    # lock wait timeout, NOWAIT's miss included, is a miss on the same session, never a
    # lost connection (Django's OperationalError without a SQLSTATE counted as one).
    (MySQLdb.OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction"),
     True, False, False),
    (MySQLdb.OperationalError(1969, "Query execution was interrupted (max_statement_time "
                                    "exceeded)"), True, False, False),
    (MySQLdb.OperationalError(3572, "Statement aborted because lock(s) could not be acquired "
                                    "immediately and NOWAIT is set."), True, False, False),
    (MySQLdb.OperationalError(2013, "Lost connection to server during query"),
     False, True, True),
    (MySQLdb.OperationalError(2006, "Server has gone away"), False, True, True),
    (MySQLdb.OperationalError(1927, "Connection was killed"), False, True, True),
    (MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock; try restarting "
                                    "transaction"), False, False, False),
    (MySQLdb.ProgrammingError(1146, "Table doesn't exist"), False, False, False),
])
def test_the_database_classifications(exc: BaseException, busy: bool, lost: bool,
                                      ended: bool) -> None:
    """What the call sites decide before they translate: a miss (busy), a retry on a new
    session (lost), a LockLost in transaction mode (ended: never SQLite's)."""
    drivers = (psycopg.Error, MySQLdb.Error)
    for raised in (exc, _django_wrapped(exc) if isinstance(exc, drivers) else exc):
        assert (is_busy(raised), connection_lost(raised)) == (busy, lost), raised
        if not isinstance(raised, django.db.Error) or isinstance(raised.__cause__, drivers):
            assert session_ended(raised) is ended, raised
    sqlite_wrapped = django.db.OperationalError("disk I/O error")
    sqlite_wrapped.__cause__ = sqlite3.OperationalError("disk I/O error")
    assert connection_lost(sqlite_wrapped) and not session_ended(sqlite_wrapped)


@pytest.mark.parametrize("exc, refused", [
    (psycopg.errors.SerializationFailure("could not serialize access"), True),
    (psycopg.errors.DeadlockDetected("deadlock detected"), True),
    (MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock; try restarting "
                                    "transaction"), True),
    (MySQLdb.OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction"),
     False),  # InnoDB rolls back the statement only: the transaction goes on
    (psycopg.errors.LockNotAvailable("could not obtain lock"), False),
])
def test_a_transaction_the_database_refused_as_a_whole(exc: BaseException, refused: bool) -> None:
    """What the audit's bucket writes and the optimistic retry run again."""
    for raised in (exc, _django_wrapped(exc)):
        assert transaction_refused(raised) is refused, raised


def test_the_database_map_catches_the_drivers_and_djangos_errors() -> None:
    for cls in (django.db.Error, django.db.OperationalError, psycopg.Error,
                psycopg.errors.LockNotAvailable, MySQLdb.Error, MySQLdb.OperationalError):
        assert issubclass(cls, DATABASE_ERRORS.client)
    assert not issubclass(sqlite3.Error, DATABASE_ERRORS.client)  # Django wraps SQLite's


# -- Redis ---------------------------------------------------------------------------

@pytest.mark.parametrize("exc", [
    redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
    redis.exceptions.TimeoutError("Timeout reading from socket"),
    redis.exceptions.ResponseError("ERR unknown command 'INFO'"),
    redis.exceptions.NoScriptError("NOSCRIPT No matching script"),
    redis.exceptions.AuthenticationError("invalid password"),
    redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
    redis.exceptions.RedisClusterException("Redis Cluster cannot be connected"),
])
def test_the_redis_map(exc: BaseException) -> None:
    assert isinstance(exc, REDIS_ERRORS.client)
    error = translated(REDIS_ERRORS, exc)
    assert type(error) is BackendUnavailable
    assert str(error) == f"Redis failed: {type(exc).__name__}: {exc}"
    assert error.__cause__ is exc
    doing = translated(REDIS_ERRORS, exc, "connecting")
    assert str(doing).startswith(f"Redis failed while connecting: {type(exc).__name__}")


def test_a_redis_that_refuses_info_is_told_apart_by_the_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The boundary translates INFO's refusal (the command renamed away) like any error;
    the eviction check tells it apart by its ``__cause__`` and goes on without knowing
    (a warning), and the lock works. A real server: what it refuses is its own."""
    require_redis()
    server = Server(tmp_path, ("--rename-command", "INFO", ""))
    server.start()
    backend = RedisBackend("no-info", {"LOCATION": server.url()})
    try:
        with caplog.at_level(logging.WARNING, logger="django_distlock"):
            assert backend.eviction_problem(timeout=2) is None
        assert "Redis refused INFO; cannot tell whether it evicts lock keys." in caplog.text
        with backend.lock("refused-info", timeout=1) as lease:
            assert lease.fencing_token
    finally:
        backend.close()
        server.kill()


# -- ZooKeeper -----------------------------------------------------------------------

@pytest.mark.parametrize("exc, why", [
    (KazooTimeoutError("Connection time-out"),
     "ZooKeeper did not answer in time (no server reachable, or no quorum)"),
    (NoAuthError(), "ZooKeeper refused access (the node's ACL does not grant OPTIONS['AUTH'] it)"),
    (SessionExpiredError(), "the ZooKeeper session expired"),
    (ConnectionClosedError("Connection has been closed"), "the ZooKeeper session expired"),
    (ConnectionLoss(), "the connection to ZooKeeper was lost"),
    (NoNodeError(), "ZooKeeper failed: NoNodeError: "),
])
def test_the_zookeeper_map(exc: BaseException, why: str) -> None:
    """The reads' retry (``Client.call``) looks at ``__cause__`` for ConnectionLoss and
    SessionExpiredError: the chain is the map's contract."""
    assert isinstance(exc, ZOOKEEPER_ERRORS.client)
    error = translated(ZOOKEEPER_ERRORS, exc, "listing /distlock/x")
    assert type(error) is BackendUnavailable
    assert str(error).startswith(why)
    assert str(error).endswith(" while listing /distlock/x.")
    assert error.__cause__ is exc
    assert str(translated(ZOOKEEPER_ERRORS, exc)).endswith(".")


# -- cache ---------------------------------------------------------------------------

@pytest.mark.parametrize("exc, kind, message", [
    (MemcacheUnknownCommandError(b"ERROR"), LockConfigurationError,
     "CACHES['locks']: the memcached server does not know the meta commands; the cache "
     "lock backend needs memcached 1.6 or later."),
    (MemcacheUnexpectedCloseError(), BackendUnavailable, "memcached (cache 'locks') failed: "),
    (MemcacheServerError("out of memory"), BackendUnavailable,
     "memcached (cache 'locks') failed: out of memory"),
    (ConnectionRefusedError(111, "Connection refused"), BackendUnavailable,
     "memcached (cache 'locks') failed: [Errno 111] Connection refused"),
    (redis.exceptions.ConnectionError("Connection refused"), BackendUnavailable,
     "Redis (cache 'locks') failed: Connection refused"),
])
def test_the_cache_map(exc: BaseException, kind: type[Exception], message: str) -> None:
    assert isinstance(exc, CACHE_ERRORS.client)
    error = translated(CACHE_ERRORS, exc, where="locks")
    assert type(error) is kind
    assert str(error).startswith(message)
    assert error.__cause__ is exc
