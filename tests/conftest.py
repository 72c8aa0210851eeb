"""Fixtures shared by the suite.

``scripts/test`` starts PostgreSQL (and the other servers) and sets
``DISTLOCK_SERVERS=1``: then a missing server fails the tests that need it.
In a local partial run without servers, those tests skip with a reason.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_distlock import locks
from django_distlock.testing import in_thread  # noqa: F401  (re-exported for the tests)
from django_distlock.testing.contract.support import close_async_connections

FULL_RUN = os.environ.get("DISTLOCK_SERVERS") == "1"
SQLITE_ALIASES = ["sqlite-lease", "sqlite-tx"]
PG_ALIASES = ["pg-lease", "pg-tx"]
#: The test databases a transactional test lists (each is flushed after it): SQLite, and
#: PostgreSQL and MariaDB when started.
DATABASES = ["default", *(db for db in ("pg", "mysql") if db in settings.DATABASES)]


def require_pg() -> None:
    """Fail (full run) or skip (local partial run) when PostgreSQL is not configured."""
    if "pg" in settings.DATABASES:
        return
    if FULL_RUN:
        pytest.fail("DISTLOCK_SERVERS=1 but DISTLOCK_PG_PORT is not set: PostgreSQL is missing.")
    pytest.skip("PostgreSQL not started (run scripts/test for the full suite)")


#: The apps of the library and of the tests, without Django's own (auth, contenttypes,
#: admin, sessions, messages): a transactional test whose mark lists these as its
#: ``available_apps`` flushes only their tables, and no ``post_migrate`` handler makes
#: Django's content types and permissions again after each test (65 ms a test on SQLite
#: and PostgreSQL; CONTRIBUTING.md, "The tiers"). Such a test cannot use Django's own
#: models (the admin, users): their modules keep the plain mark.
LIBRARY_APPS = [app for app in settings.INSTALLED_APPS if not app.startswith("django.")]
#: The mark of a transactional test on the library's apps (``LIBRARY_APPS``).
LIBRARY_DB = pytest.mark.django_db(transaction=True, databases=DATABASES,
                                   available_apps=LIBRARY_APPS)

MYSQL_ALIASES = ["mysql-lease", "mysql-tx", "mysql-session"]


def require_mysql() -> None:
    """Fail (full run) or skip (local partial run) when MariaDB is not configured."""
    if "mysql" in settings.DATABASES:
        return
    if FULL_RUN:
        pytest.fail("DISTLOCK_SERVERS=1 but DISTLOCK_MYSQL_PORT is not set: MariaDB is missing.")
    pytest.skip("MariaDB not started (run scripts/test for the full suite)")


REDIS_ALIASES = ["redis", "redis-cache", "redis-djcache", "redis-unfair"]


def require_redis(cluster: bool = False, redlock: bool = False) -> None:
    """Fail (full run) or skip (local partial run) when Redis (or its cluster, or the
    Redlock masters) is absent."""
    alias = "redis-cluster" if cluster else "redlock" if redlock else "redis"
    if alias in settings.DISTLOCK:
        return
    what = {
        "redis-cluster": "DISTLOCK_REDIS_CLUSTER_URL",
        "redlock": "DISTLOCK_REDLOCK_URLS",
        "redis": "DISTLOCK_REDIS_URL",
    }[alias]
    if FULL_RUN:
        pytest.fail(f"DISTLOCK_SERVERS=1 but {what} is not set: Redis is missing.")
    pytest.skip("Redis not started (run scripts/test for the full suite)")


CACHE_ALIASES = ["cache-memcached", "cache-redis"]


def require_memcached() -> None:
    """Fail (full run) or skip (local partial run) when memcached is absent."""
    if "cache-memcached" in settings.DISTLOCK:
        return
    if FULL_RUN:
        pytest.fail("DISTLOCK_SERVERS=1 but DISTLOCK_MEMCACHED is not set: memcached is missing.")
    pytest.skip("memcached not started (run scripts/test for the full suite)")


ZK_ALIASES = ["zk", "zk-auth"]


def require_zookeeper() -> None:
    """Fail (full run) or skip (local partial run) when the ZooKeeper ensemble is absent."""
    if "zk" in settings.DISTLOCK:
        return
    if FULL_RUN:
        pytest.fail("DISTLOCK_SERVERS=1 but DISTLOCK_ZK_HOSTS is not set: ZooKeeper is missing.")
    pytest.skip("ZooKeeper not started (run scripts/test for the full suite)")


def require_alias(alias: str) -> None:
    """Fail (full run) or skip (local partial run) when ``alias``' server is absent (the
    aliases of tests/settings.py)."""
    if alias.startswith("pg"):
        require_pg()
    elif alias.startswith("mysql"):
        require_mysql()
    elif alias == "redlock":
        require_redis(redlock=True)
    elif alias == "redis-cluster":
        require_redis(cluster=True)
    elif alias.startswith("redis") or alias == "cache-redis":
        require_redis()
    elif alias.startswith("zk"):
        require_zookeeper()
    elif alias == "cache-memcached":
        require_memcached()


@pytest.fixture
def zk() -> Any:
    """The ``"zk"`` alias' :class:`ZooKeeperBackend` (a full run fails without ZooKeeper)."""
    from django_distlock.backends.zookeeper import ZooKeeperBackend

    require_zookeeper()
    backend = locks["zk"]
    assert isinstance(backend, ZooKeeperBackend)
    return backend


def psycopg_params(database: str) -> dict[str, Any]:
    """``psycopg.connect()`` keywords for the database alias ``database`` (a side connection)."""
    db = connections[database].settings_dict
    return {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "dbname": db["NAME"]}


def mysql_side(database: str) -> Any:
    """A raw MySQLdb connection (autocommit) of the test user to the alias ``database``,
    apart from Django's (any thread may close it)."""
    import MySQLdb

    db = connections[database].settings_dict
    return MySQLdb.connect(host=db["HOST"], port=int(db["PORT"]), user=db["USER"],
                           database=db["NAME"], autocommit=True)


def kill_mysql_connection(database: str, ident: int) -> None:
    """``KILL CONNECTION`` of the MariaDB session ``ident``, from a side connection of the
    test user to the alias ``database``."""
    side = mysql_side(database)
    try:
        side.cursor().execute(f"KILL CONNECTION {int(ident)}")
    finally:
        side.close()


def needs_pg(alias: str) -> bool:
    return alias.startswith("pg")


@pytest.fixture(autouse=True, scope="session")
def _close_lock_connections(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    yield
    # Torn down before django_db_setup drops the test databases: the backends' sessions,
    # and the Django connections asgiref's executor thread opened for event loops.
    locks.close_all()
    close_async_connections()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Return a function making lock names unique to this test."""
    tag = uuid.uuid4().hex[:8]
    return lambda name="lock": f"{name}:{tag}"


def advisory_locks(
    backend: Any, key: str, seed: int, granted: bool = True, own_session: bool = False
) -> int:
    """How many sessions hold (or wait for) the PostgreSQL advisory lock
    ``hashtextextended(key, seed)``; only the backend's own session with ``own_session``.
    Read on the backend's lease session (see migration 0002 for what the seeds are)."""
    cursor = backend.sessions.get().cursor
    cursor.execute(
        "SELECT count(*) FROM pg_locks, (SELECT hashtextextended(%s, %s) AS k) h"
        " WHERE locktype = 'advisory' AND granted = %s AND objsubid = 1"
        " AND classid::bigint = (h.k >> 32) & 4294967295 AND objid::bigint = h.k & 4294967295"
        " AND (NOT %s OR pid = pg_backend_pid())",
        [key, seed, granted, own_session],
    )
    count: int = cursor.fetchone()[0]
    return count


@pytest.fixture
def own_redis(tmp_path: Any) -> Iterator[Any]:
    """A private ``redis-server`` (``tests.private_redis.Server``) this test may freeze,
    kill or restart; killed at the end."""
    from .private_redis import Server

    require_redis()  # redis-server and its client are there
    own = Server(tmp_path)
    own.start()
    try:
        yield own
    finally:
        own.kill()


def eventually(check: Callable[[], Any], timeout: float = 10) -> bool:
    """Poll ``check`` until it is true (True) or ``timeout`` seconds pass (False).

    It answers what it saw: a condition that held and no longer does (a PostgreSQL
    kinds head is listed while idle, not during its look at the row) is not turned into
    a False by one more check (test_waiters failed so, 2 runs in 15).
    """
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def soak(ci: Any, longer: Any) -> Any:
    """A scenario's size: ``ci`` in a normal run, ``longer`` under ``scripts/test --soak``
    (``DISTLOCK_SOAK=1``: the same fault scenarios, longer and with more processes)."""
    return longer if os.environ.get("DISTLOCK_SOAK") == "1" else ci


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a module marked both ``django_versions`` and ``second_env``: it would run in
    py312-django6 only (CONTRIBUTING.md, "The tiers")."""
    both = sorted({item.module.__name__ for item in items if item.module is not None
                   and item.get_closest_marker("django_versions")
                   and item.get_closest_marker("second_env")})
    if both:
        raise pytest.UsageError(f"marked both django_versions and second_env: {both}")
