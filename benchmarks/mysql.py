"""MySQL and MariaDB cases: a raw round trip, named locks (``GET_LOCK``) by hand and
through django-mysql's ``Lock``, a ``SELECT ... FOR UPDATE`` transaction by hand, and
django-distlock's database backend in both modes (docs/database.md, "MySQL and MariaDB").

Hand-written clients use a raw ``MySQLdb`` connection (mysqlclient, the driver Django
recommends) in autocommit; ``mysql.for-update-django`` sends its statements through
Django's connection and ``atomic()``, the envelope transaction mode runs in.
"""

from __future__ import annotations

import functools
import itertools
import os
import secrets
import socket
import threading
from typing import Any

from . import contention, lockers, uncontended
from .harness import Unavailable, add_bar, add_case

TTL, ACQUIRE_TIMEOUT = lockers.TTL, lockers.ACQUIRE_TIMEOUT
GROUP = "mysql"
ALLOWED_HOSTS = ("127.0.0.1",)
#: The Django alias of the benchmark database on MariaDB (benchmarks/settings.py).
DATABASE = "mysql"
#: The lock table's row that the hand-written transactions lock.
TABLE = "django_distlock_lock"


def connect() -> Any:
    """A raw MySQLdb autocommit connection to the benchmark database."""
    import MySQLdb

    lockers.django_setup()
    from django.conf import settings

    db = settings.DATABASES[DATABASE]
    return MySQLdb.connect(host=db["HOST"], port=int(db["PORT"]), user=db["USER"],
                           database=db["NAME"], charset="utf8mb4", autocommit=True)


def setup() -> None:
    """Check the target, create the benchmark database if missing, and migrate it.

    :raises Unavailable: when no MariaDB or MySQL is configured, or mysqlclient is missing.
    :raises SystemExit: when the configured host is not 127.0.0.1.
    """
    if not os.environ.get("DISTLOCK_MYSQL_PORT"):
        raise Unavailable("DISTLOCK_MYSQL_PORT is not set: run scripts/bench, or export "
                          "DISTLOCK_MYSQL_PORT (and DISTLOCK_MYSQL_HOST/USER) for your own server")
    try:
        import MySQLdb
    except ImportError as exc:
        raise Unavailable("mysqlclient is not installed (the `mysql` extra)") from exc
    lockers.django_setup()
    from django.conf import settings
    from django.core.management import call_command

    db = settings.DATABASES[DATABASE]
    if db["HOST"] not in ALLOWED_HOSTS:
        raise SystemExit(f"benchmarks: refusing to target MySQL on {db['HOST']!r}: "
                         "only 127.0.0.1")
    server = MySQLdb.connect(host=db["HOST"], port=int(db["PORT"]), user=db["USER"],
                             autocommit=True)
    try:
        server.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{db['NAME']}` "
                                "CHARACTER SET utf8mb4")
    finally:
        server.close()
    call_command("migrate", database=DATABASE, verbosity=0, interactive=False)
    conn = connect()
    try:  # leftovers of an interrupted run would start as held
        conn.cursor().execute(f"DELETE FROM {TABLE} WHERE name LIKE 'bench:%%'")
    finally:
        conn.close()


def describe() -> str:
    """The server's version and the settings that decide what a commit costs."""
    import MySQLdb

    conn = connect()
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT @@version, @@innodb_flush_log_at_trx_commit, "
                       "@@innodb_doublewrite")
        version, flush, doublewrite = cursor.fetchone()
    finally:
        conn.close()
    client = ".".join(map(str, MySQLdb.version_info[:3]))
    return (f"MySQL/MariaDB {version} (innodb_flush_log_at_trx_commit={flush}, "
            f"innodb_doublewrite={doublewrite}); mysqlclient {client}")


# --------------------------------------------------------------------------- lockers


class HandLease:
    """(b) The backend's lease calls sent by hand: ``CALL django_distlock_acquire`` with a
    fresh owner, then ``CALL django_distlock_release``, on a raw connection set up as the
    backend's sessions are (``mysql_sql.SESSION_SETUP``): the floor of its algorithm."""

    def __init__(self, key: str) -> None:
        from django_distlock.backends.database import mysql_sql, sql

        self.conn = connect()
        self.cursor = self.conn.cursor()
        for statement in mysql_sql.SESSION_SETUP:
            self.cursor.execute(statement)
        self.acquire_sql, self.release_sql = mysql_sql.MYSQL.acquire, mysql_sql.MYSQL.release
        self.params_of, self.release_params_of = sql.acquire_params, sql.release_params
        self.key = key
        self.holder = (socket.gethostname(), os.getpid(), threading.current_thread().name)
        self.token = ""
        self.generation: int | None = None

    def acquire(self) -> bool:
        self.token = token = secrets.token_hex(16)
        host, pid, thread = self.holder
        self.cursor.execute(self.acquire_sql, self.params_of(self.key, token, TTL, host, pid,
                                                             thread))
        row = self.cursor.fetchone()
        self.generation = row[5] if row else None
        return bool(row and row[0])

    def release(self) -> None:
        params = self.release_params_of(self.key, self.token, self.generation)
        self.cursor.execute(self.release_sql, params)
        self.cursor.fetchone()

    def close(self) -> None:
        self.conn.close()


class GetLock:
    """(c) ``GET_LOCK(name, timeout)`` + ``RELEASE_LOCK(name)`` by hand: a named lock of
    the connection, no lease, no token."""

    def __init__(self, key: str) -> None:
        self.conn = connect()
        self.cursor = self.conn.cursor()
        self.params = [key[:64]]

    def acquire(self) -> bool:
        self.cursor.execute("SELECT GET_LOCK(%s, %s)", [*self.params, ACQUIRE_TIMEOUT])
        return self.cursor.fetchone()[0] == 1

    def release(self) -> None:
        self.cursor.execute("SELECT RELEASE_LOCK(%s)", self.params)
        self.cursor.fetchone()

    def close(self) -> None:
        self.conn.close()


class SessionCalls:
    """(i'') Session mode's two statements with no lock handle around them: the grant
    (``SESSION_GRANT``: the named lock and the token's ``UUID_SHORT()``) and the release
    (``SESSION_UNLOCK``), sent as the backend sends them, on one of its sessions. (i)
    minus (i'') is the handle layer's share, (i'') over (c) the statements', both
    measured in the same run."""

    def __init__(self, key: str) -> None:
        lockers.django_setup()
        from django_distlock import locks
        from django_distlock.backends.database import mysql_sql, session_mysql

        self.locks = locks
        backend = locks["mysql-session"]
        self.pool, self.session = backend.pool, backend.pool.take()
        self.conn, self.query = self.session.wrapper.connection, session_mysql._query
        self.grant, self.unlock = mysql_sql.SESSION_GRANT, mysql_sql.SESSION_UNLOCK
        self.quoted = f"'{backend.lock_name(backend.make_key(key))}'".encode()

    def acquire(self) -> bool:
        row = self.query(self.conn, self.grant % (self.quoted,))
        return bool(row and row[0])

    def release(self) -> None:
        self.query(self.conn, self.unlock % (self.quoted,))

    def close(self) -> None:
        self.pool.give_back(self.session)
        self.locks.close_all()


class DjangoMySqlLock:
    """(d) django-mysql's ``Lock(name, acquire_timeout, using)``: ``GET_LOCK`` through
    Django's connection (what the MySQL world uses today)."""

    def __init__(self, key: str) -> None:
        lockers.django_setup()
        try:
            from django_mysql.locks import Lock
        except ImportError as exc:
            raise Unavailable("django-mysql is not installed (the `dev` extra)") from exc
        self.lock = Lock(key[:40], acquire_timeout=ACQUIRE_TIMEOUT, using=DATABASE)
        self.timeout_error = _django_mysql_timeout()

    def acquire(self) -> bool:
        try:
            self.lock.acquire()
        except self.timeout_error:
            return False
        return True

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


def _django_mysql_timeout() -> type[BaseException]:
    from django_mysql.exceptions import TimeoutError as LockTimeout

    return LockTimeout


class ForUpdate:
    """(e) The seed's recipe by hand: ``with atomic(): SELECT ... FOR UPDATE`` of the
    name's row through Django's connection, then the commit (``django_binding``, the
    floor of transaction mode; ``write``: with one ``UPDATE`` of the row under the lock,
    the seed's stock write, which makes the commit flush the log), or
    ``BEGIN``/``FOR UPDATE``/``COMMIT`` on a raw connection. The wait is InnoDB's,
    bounded by ``innodb_lock_wait_timeout``."""

    def __init__(self, key: str, *, django_binding: bool = True, write: bool = False) -> None:
        self.key, self.django_binding, self.write = key, django_binding, write
        self.atomic: Any = None
        if django_binding:
            lockers.django_setup()
            from django.db import connections

            self.connection = connections[DATABASE]
            with self.connection.cursor() as cursor:
                cursor.execute(f"INSERT IGNORE INTO {TABLE} (name, fencing, host, thread) "
                               "VALUES (%s, 0, '', '')", [key])
        else:
            self.conn = connect()
            self.cursor = self.conn.cursor()
            self.cursor.execute(f"INSERT IGNORE INTO {TABLE} (name, fencing, host, thread) "
                                "VALUES (%s, 0, '', '')", [key])

    def acquire(self) -> bool:
        statement = f"SELECT 1 FROM {TABLE} WHERE name = %s FOR UPDATE"
        if not self.django_binding:
            self.cursor.execute("BEGIN")
            self.cursor.execute(statement, [self.key])
            return self.cursor.fetchone() is not None
        from django.db import transaction

        self.atomic = transaction.atomic(using=DATABASE)
        self.atomic.__enter__()
        with self.connection.cursor() as cursor:
            cursor.execute(statement, [self.key])
            found = cursor.fetchone() is not None
            if self.write:  # the recipe's write under the lock: its commit is durable
                cursor.execute(f"UPDATE {TABLE} SET fencing = fencing + 1 WHERE name = %s",
                               [self.key])
            return found

    def release(self) -> None:
        if not self.django_binding:
            self.cursor.execute("COMMIT")
            return
        atomic, self.atomic = self.atomic, None
        atomic.__exit__(None, None, None)

    def close(self) -> None:
        if self.django_binding:
            from django.db import connections

            connections.close_all()
        else:
            self.conn.close()


class SelectOne(lockers.SelectOne):
    """(a) :class:`benchmarks.lockers.SelectOne` on a MySQLdb connection (a class of this
    module: the harness sets up the module a case's class is in)."""

    def __init__(self, key: str) -> None:
        super().__init__(key, connect=connect)


class DistLock(lockers.DistLock):
    """(f, g) django-distlock through its public API (:class:`benchmarks.lockers.DistLock`);
    transaction mode's acquire opens its own ``atomic()`` block, as the decorator does."""


class TwoNames(DistLock):
    """(i') django-distlock on two names in turn (``key``, then ``key`` + ``:b``): in
    MySQL session mode each grant's session row names the other name, so every grant
    writes its row (``INSERT ... SELECT``), where one name's grants write none after the
    first (docs/database.md, session mode on MySQL and MariaDB)."""

    def __init__(self, key: str, *, alias: str) -> None:
        super().__init__(key, alias=alias)
        self.names = itertools.cycle([key, key + ":b"])

    def _handle(self) -> Any:
        return self.locks[self.alias].lock(next(self.names), ttl=TTL, timeout=self.timeout)


class Permits(DistLock):
    """(h) django-distlock's ``semaphore(name, limit)`` in lease mode: a waiting head is
    woken by the release of the permit that ends first; another permit's release is
    seen at its next look (docs/database.md)."""

    def __init__(self, key: str, *, limit: int) -> None:
        super().__init__(key, alias="mysql")
        self.limit = limit

    def _handle(self) -> Any:
        return self.locks[self.alias].semaphore(self.key, self.limit, ttl=TTL,
                                                timeout=self.timeout)


lease = functools.partial(DistLock, alias="mysql")
transaction_mode = functools.partial(DistLock, alias="mysql-tx")
session_mode = functools.partial(DistLock, alias="mysql-session")
for_update_raw = functools.partial(ForUpdate, django_binding=False)
for_update_write = functools.partial(ForUpdate, write=True)

# --------------------------------------------------------------------------- cases

_U, _C = uncontended.NAME, contention.NAME
add_case(_U, "mysql.select1", SelectOne, "(a) `SELECT 1`, one round trip", group=GROUP,
         reference="RTT")
add_case(_U, "mysql.floor", HandLease, "(b) backend's 2 lease calls by hand (MySQLdb)",
         group=GROUP, reference="floor")
add_case(_U, "mysql.get_lock", GetLock, "(c) `GET_LOCK` + `RELEASE_LOCK` by hand",
         group=GROUP, reference="GET_LOCK")
add_case(_U, "mysql.django-mysql", DjangoMySqlLock, "(d) django-mysql's `Lock`", group=GROUP)
add_case(_U, "mysql.for-update-django", ForUpdate,
         "(e) `atomic()` + `SELECT ... FOR UPDATE` by hand, through Django", group=GROUP,
         reference="FOR UPDATE")
add_case(_U, "mysql.for-update-write", for_update_write,
         "(e'') the same with one `UPDATE` of the row (a durable commit)", group=GROUP)
add_case(_U, "mysql.for-update-raw", for_update_raw,
         "(e') `BEGIN` + `FOR UPDATE` + `COMMIT` on MySQLdb", group=GROUP)
add_case(_U, "mysql.lease", lease, "(f) django-distlock, lease mode", group=GROUP)
add_case(_U, "mysql.tx", transaction_mode, "(g) django-distlock, transaction mode", group=GROUP)
add_case(_U, "mysql.session", session_mode, "(i) django-distlock, session mode", group=GROUP)
add_case(_U, "mysql.session-names", functools.partial(TwoNames, alias="mysql-session"),
         "(i') the same on two names in turn: each grant writes its row", group=GROUP)
add_case(_U, "mysql.session-calls", SessionCalls,
         "(i'') session mode's two statements, no lock handle", group=GROUP)
add_bar(_U, "mysql.lease", "mysql.floor", 1.3)
add_bar(_U, "mysql.lease", "mysql.get_lock", None)
add_bar(_U, "mysql.lease", "mysql.django-mysql", None)
add_bar(_U, "mysql.tx", "mysql.for-update-django", 1.2)
add_bar(_U, "mysql.tx", "mysql.for-update-write", None)
add_bar(_U, "mysql.tx", "mysql.for-update-raw", None)
add_bar(_U, "mysql.session", "mysql.get_lock", 1.15)
add_bar(_U, "mysql.session", "mysql.django-mysql", 1.0)
add_bar(_U, "mysql.session-names", "mysql.get_lock", None)
add_bar(_U, "mysql.session-calls", "mysql.get_lock", None)

add_case(_C, "mysql.get_lock", GetLock, "`GET_LOCK` (blocking)", group=GROUP,
         reference="GET_LOCK")
add_case(_C, "mysql.django-mysql", DjangoMySqlLock, "django-mysql's `Lock` (blocking)",
         group=GROUP)
add_case(_C, "mysql.for-update-raw", for_update_raw, "`SELECT ... FOR UPDATE` (row lock)",
         group=GROUP)
add_case(_C, "mysql.lease", lease, "django-distlock lease mode (queue in the server)",
         group=GROUP)
add_case(_C, "mysql.tx", transaction_mode, "django-distlock transaction mode (row lock)",
         group=GROUP)
add_case(_C, "mysql.session", session_mode, "django-distlock session mode (named lock)",
         group=GROUP)
add_case(_C, "mysql.semaphore-1", functools.partial(Permits, limit=1),
         "django-distlock `semaphore(name, 1)`, lease mode", group=GROUP)
add_case(_C, "mysql.semaphore-2", functools.partial(Permits, limit=2),
         "django-distlock `semaphore(name, 2)`: 2 permits", group=GROUP, at_once=2)
add_bar(_C, "mysql.lease", "mysql.get_lock", None)
add_bar(_C, "mysql.tx", "mysql.for-update-raw", None)
add_bar(_C, "mysql.session", "mysql.get_lock", 1.2)
add_bar(_C, "mysql.session", "mysql.django-mysql", None)
add_bar(_C, "mysql.semaphore-1", "mysql.lease", None, metric="rate")
add_bar(_C, "mysql.semaphore-2", "mysql.lease", None, metric="rate")
