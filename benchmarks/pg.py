"""PostgreSQL cases: raw round trips, advisory locks, and django-distlock's database backend.

Every hand-written client uses psycopg 3 in autocommit with its defaults
(server-side binding, statements prepared after 5 uses); ``pg.floor-django``
sends the same statements the way Django's cursor does (client-side binding,
simple query protocol, never prepared), to tell the cost of the protocol
from the cost of the Python above it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import socket
import threading
from typing import Any

import psycopg
from psycopg import sql

from . import asyncio_contended, contention, lockers, uncontended
from .harness import Unavailable, add_bar, add_case

TTL, ACQUIRE_TIMEOUT = lockers.TTL, lockers.ACQUIRE_TIMEOUT
GROUP = "postgres"
ALLOWED_HOSTS = ("127.0.0.1",)


# --------------------------------------------------------------------------- setup


_django = lockers.django_setup


def _conninfo(dbname: str | None = None) -> dict[str, Any]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    name = dbname or db["NAME"]
    return {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "dbname": name}


def connect(**kwargs: Any) -> psycopg.Connection[Any]:
    """A psycopg 3 autocommit connection to the benchmark database."""
    _django()
    return psycopg.connect(**_conninfo(), autocommit=True, **kwargs)


def setup() -> None:
    """Check the target, create the benchmark database if missing, and migrate it.

    :raises Unavailable: when no PostgreSQL is configured.
    :raises SystemExit: when the configured host is not 127.0.0.1.
    """
    from django.conf import settings
    from django.core.management import call_command

    if not os.environ.get("DISTLOCK_PG_PORT"):
        raise Unavailable(
            "DISTLOCK_PG_PORT is not set: run scripts/bench, or export DISTLOCK_PG_PORT "
            "(and DISTLOCK_PG_HOST/USER/NAME) for your own server"
        )
    host = settings.DATABASES["default"]["HOST"]
    if host not in ALLOWED_HOSTS:
        raise SystemExit(f"benchmarks: refusing to target PostgreSQL on {host!r}: only 127.0.0.1")
    name = settings.DATABASES["default"]["NAME"]
    maintenance = os.environ.get("DISTLOCK_PG_NAME", "postgres")
    with psycopg.connect(**_conninfo(maintenance), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    call_command("migrate", verbosity=0, interactive=False)
    with connect() as conn:  # leftovers of an interrupted run would start as held
        conn.execute("DELETE FROM django_distlock_lock WHERE name LIKE 'bench:%'")


def describe() -> str:
    """The server's version and the settings that decide what a commit costs."""
    with connect() as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('fsync'),"
            " current_setting('synchronous_commit')"
        ).fetchone()
    assert row is not None
    return (
        f"PostgreSQL {row[0]} (fsync={row[1]}, synchronous_commit={row[2]}); "
        f"psycopg {psycopg.__version__}"
    )


# --------------------------------------------------------------------------- lockers


class HandLease:
    """(b) The backend's lease statements sent by hand: the floor of its algorithm.

    Per pair: ``sql.POSTGRESQL.acquire`` with a fresh ``secrets.token_hex(16)``
    owner, then ``.release``, params shaped as the backend's; ``lock_timeout``
    set once per connection as the backend's sessions do (``sessions.ROW_LOCK_WAIT``).
    ``django_binding=True`` sends them as Django's cursor does.
    """

    def __init__(self, key: str, *, django_binding: bool = False) -> None:
        from django_distlock.backends.database import sql
        from django_distlock.backends.database.sessions import ROW_LOCK_WAIT

        options: dict[str, Any] = {}
        if django_binding:
            options = {"cursor_factory": psycopg.ClientCursor, "prepare_threshold": None}
        self.conn = connect(**options)
        self.cursor = self.conn.cursor()
        self.cursor.execute("SELECT set_config('lock_timeout', %s, false)", [ROW_LOCK_WAIT])
        self.acquire_sql, self.release_sql = sql.POSTGRESQL.acquire, sql.POSTGRESQL.release
        self.params_of, self.release_params_of = sql.acquire_params, sql.release_params
        self.key = key
        self.holder = (socket.gethostname(), os.getpid(), threading.current_thread().name)
        self.token = ""
        self.generation: int | None = None

    def acquire(self) -> bool:
        self.token = token = secrets.token_hex(16)
        host, pid, thread = self.holder
        params = self.params_of(self.key, token, TTL, host, pid, thread)
        self.cursor.execute(self.acquire_sql, params)
        row = self.cursor.fetchone()
        self.generation = row[5] if row else None
        return bool(row and row[0])

    def release(self) -> None:
        params = self.release_params_of(self.key, self.token, self.generation)
        self.cursor.execute(self.release_sql, params)
        self.cursor.fetchone()

    def close(self) -> None:
        self.conn.close()


def advisory_key(key: str) -> int:
    """A stable signed 64-bit advisory-lock key for a name."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


class Advisory:
    """(c) ``pg_advisory_lock(k)`` + ``pg_advisory_unlock(k)``, session-level, by hand.

    ``lock_timeout`` bounds the blocking call by the same timeout the other
    cases use; hitting it counts as "not acquired".
    """

    def __init__(self, key: str) -> None:
        self.conn = connect()
        self.cursor = self.conn.cursor()
        self.cursor.execute(
            "SELECT set_config('lock_timeout', %s, false)", [f"{int(ACQUIRE_TIMEOUT * 1000)}ms"]
        )
        self.params = [advisory_key(key)]

    def acquire(self) -> bool:
        try:
            self.cursor.execute("SELECT pg_advisory_lock(%s)", self.params)
        except psycopg.errors.LockNotAvailable:
            return False
        self.cursor.fetchone()
        return True

    def release(self) -> None:
        self.cursor.execute("SELECT pg_advisory_unlock(%s)", self.params)
        self.cursor.fetchone()

    def close(self) -> None:
        self.conn.close()


class SessionCalls:
    """(f') Session mode's two statements with no lock handle around them: the try
    (``PG_TRY``: ``pg_try_advisory_lock``, the token's ``nextval()``, the session's label
    with a fresh owner id) and the release (``PG_UNLOCK``), prepared and sent through
    libpq as the backend sends them, on one of its sessions. (f) minus (f') is the
    handle layer's share, (f') over (c) the statements', both measured in the same run."""

    def __init__(self, key: str) -> None:
        lockers.django_setup()
        from django_distlock import locks
        from django_distlock.backends.database import prepared, session_mode
        from django_distlock.backends.database.sql import ENSURE_ROW

        self.locks = locks
        backend = locks["pg-session"]
        self.pool, self.session = backend.pool, backend.pool.take()
        key = backend.make_key(key)
        with self.session.mutex:
            self.session.execute(ENSURE_ROW, [key])
        self.keys = list(backend.note_row(key))
        self.fetch, self.try_, self.unlock = (
            prepared.fetch, session_mode.PG_TRY, session_mode.PG_UNLOCK)
        self.holder = session_mode.label_text(f"{socket.gethostname()} {os.getpid()} "
                                              f"{threading.current_thread().name}")

    def acquire(self) -> bool:
        label = f"dl {os.urandom(16).hex()[:8]} {self.holder}".encode()
        session = self.session
        return self.fetch(session.pgconn, session.prepared, self.try_,
                          [label, *self.keys]) is not None

    def release(self) -> None:
        session = self.session
        self.fetch(session.pgconn, session.prepared, self.unlock, self.keys)

    def close(self) -> None:
        self.pool.give_back(self.session)
        self.locks.close_all()


class PgLock:
    """(f) django-pglock's ``advisory(name, timeout=...)``: ``pg_advisory_lock`` through
    Django's connection, with ``lock_timeout`` set around it (what the PostgreSQL world
    uses in Django today)."""

    def __init__(self, key: str) -> None:
        lockers.django_setup()
        try:
            import pglock
        except ImportError as exc:
            raise Unavailable("django-pglock is not installed (the `dev` extra)") from exc
        self.pglock, self.key = pglock, key
        self.held: Any = None

    def acquire(self) -> bool:
        held = self.pglock.advisory(self.key, timeout=ACQUIRE_TIMEOUT,
                                    side_effect=self.pglock.Return)
        if not held.__enter__():
            held.__exit__(None, None, None)
            return False
        self.held = held
        return True

    def release(self) -> None:
        self.held.__exit__(None, None, None)

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


class SelectOne(lockers.SelectOne):
    """(a) :class:`benchmarks.lockers.SelectOne` on a psycopg connection (a class of this
    module: the harness sets up the module a case's class is in)."""

    def __init__(self, key: str) -> None:
        super().__init__(key, connect=connect)


class DistLock(lockers.DistLock):
    """(d, e) django-distlock through its public API (:class:`benchmarks.lockers.DistLock`)."""


lease = functools.partial(DistLock, alias="pg")
transaction_mode = functools.partial(DistLock, alias="pg-tx")
session_mode = functools.partial(DistLock, alias="pg-session")
#: The ``asyncio`` suite's: tasks and threads alike wait up to its TASK_TIMEOUT.
lease_tasks = functools.partial(DistLock, alias="pg", timeout=asyncio_contended.TASK_TIMEOUT)
lease_tasks_64 = functools.partial(
    DistLock, alias="pg-async64", timeout=asyncio_contended.TASK_TIMEOUT
)

# --------------------------------------------------------------------------- cases

_U, _C = uncontended.NAME, contention.NAME
add_case(
    _U, "pg.select1", SelectOne, "(a) `SELECT 1`, one round trip", group=GROUP, reference="RTT"
)
add_case(
    _U,
    "pg.floor",
    HandLease,
    "(b) backend's 2 lease statements by hand (psycopg)",
    group=GROUP,
    reference="floor",
)
add_case(
    _U,
    "pg.floor-django",
    functools.partial(HandLease, django_binding=True),
    "(b') same, Django's way: client-side binding, unprepared",
    group=GROUP,
)
add_case(
    _U,
    "pg.advisory",
    Advisory,
    "(c) `pg_advisory_lock` + `pg_advisory_unlock`",
    group=GROUP,
    reference="advisory",
)
add_case(_U, "pg.lease", lease, "(d) django-distlock, lease mode", group=GROUP)
add_case(_U, "pg.tx", transaction_mode, "(e) django-distlock, transaction mode", group=GROUP)
add_case(_U, "pg.session", session_mode, "(f) django-distlock, session mode", group=GROUP)
add_case(_U, "pg.session-calls", SessionCalls,
         "(f') session mode's two statements, no lock handle", group=GROUP)
add_case(_U, "pg.pglock", PgLock, "(g) django-pglock `advisory()`", group=GROUP)
add_bar(_U, "pg.lease", "pg.floor", 1.3)
add_bar(_U, "pg.session", "pg.advisory", 1.15)
add_bar(_U, "pg.session", "pg.pglock", 1.0)
add_bar(_U, "pg.session-calls", "pg.advisory", None)
add_bar(_U, "pg.lease", "pg.floor-django", None)
add_bar(_U, "pg.lease", "pg.advisory", None)
add_bar(_U, "pg.tx", "pg.advisory", None)

add_case(
    _C, "pg.advisory", Advisory, "`pg_advisory_lock` (blocking)", group=GROUP, reference="advisory"
)
add_case(_C, "pg.lease", lease, "django-distlock lease mode (queue in the server)", group=GROUP)
add_case(_C, "pg.tx", transaction_mode, "django-distlock transaction mode (row lock)", group=GROUP)
add_case(_C, "pg.session", session_mode, "django-distlock session mode (advisory lock)",
         group=GROUP)
add_case(_C, "pg.pglock", PgLock, "django-pglock `advisory()` (blocking)", group=GROUP)
add_bar(_C, "pg.lease", "pg.advisory", 3.0)
add_bar(_C, "pg.session", "pg.advisory", 1.2)
add_bar(_C, "pg.session", "pg.pglock", 1.0)
add_bar(_C, "pg.tx", "pg.advisory", None)

asyncio_contended.add(
    "pg.lease",
    lease_tasks,
    "django-distlock lease mode, `ASYNC_SESSIONS` default (16)",
    group=GROUP,
)
asyncio_contended.add("pg.lease-4", functools.partial(
    DistLock, alias="pg-async4", timeout=asyncio_contended.TASK_TIMEOUT),
    "the same, `ASYNC_SESSIONS: 4`", group=GROUP)
asyncio_contended.add("pg.lease-64", lease_tasks_64, "the same, `ASYNC_SESSIONS: 64`", group=GROUP)
