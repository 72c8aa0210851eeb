"""The contract on the database backend: PostgreSQL and SQLite, lease and transaction modes."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from django_distlock import locks
from django_distlock.exceptions import LockLost

from .conftest import DATABASES, in_thread, psycopg_params, require_pg
from .contract import LockContract

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)


class TestSQLiteLease(LockContract):
    alias = "sqlite-lease"


class TestSQLiteTransaction(LockContract):
    alias = "sqlite-tx"


class PostgresContract(LockContract):
    @pytest.fixture(autouse=True)
    def _pg(self) -> None:
        require_pg()


class TestPostgresLease(PostgresContract):
    alias = "pg-lease"


class TestPostgresTransaction(PostgresContract):
    alias = "pg-tx"


def _prepared_statements(backend) -> int:
    cursor = backend._session().cursor
    cursor.execute("SELECT count(*) FROM pg_prepared_statements")
    return cursor.fetchone()[0]


@pytest.mark.parametrize("prepare", [True, False])
def test_postgres_lease_statements_prepared_unless_disabled(settings, unique, prepare) -> None:
    """OPTIONS["PREPARE"]: prepared lease statements, or none (PgBouncer transaction pooling)."""
    require_pg()
    settings.DISTLOCK = {
        **settings.DISTLOCK,
        "pg-prepare": {"BACKEND": settings.DISTLOCK["pg-lease"]["BACKEND"],
                       "OPTIONS": {"DATABASE": "pg", "PREPARE": prepare}},
    }
    backend = locks["pg-prepare"]
    try:
        for grant in range(1, 4):
            with backend.lock(unique(), ttl=5) as handle:
                assert handle.fencing_token == grant
        assert (_prepared_statements(backend) >= 2) is prepare
    finally:
        backend.close()


def _advisory(backend, key: str, seed: int, granted: bool = True) -> int:
    """How many sessions hold (or wait for) the advisory lock ``hashtextextended(key, seed)``."""
    cursor = backend._session().cursor
    cursor.execute(
        "SELECT count(*) FROM pg_locks, (SELECT hashtextextended(%s, %s) AS k) h"
        " WHERE locktype = 'advisory' AND granted = %s AND objsubid = 1"
        " AND classid::bigint = (h.k >> 32) & 4294967295 AND objid::bigint = h.k & 4294967295",
        [key, seed, granted],
    )
    return cursor.fetchone()[0]


def _eventually(check, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


def test_postgres_waiters_queue_in_the_server(unique) -> None:
    """A waiting thread heads the key's queue and waits for the holder's generation lock;
    a later one times out behind it; the release wakes the head, which is granted."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    first, key = holder.fencing_token, holder.key
    assert _advisory(backend, key, first) == 1  # the holder's generation lock

    def head() -> int | None:
        handle = backend.lock(name, ttl=30)
        assert handle.acquire(timeout=20)
        token = handle.fencing_token
        handle.release()
        return token  # the thread's lock connection is closed when the thread is collected

    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(token=head()))
    thread.start()
    assert _eventually(lambda: _advisory(backend, key, first, granted=False) == 1)
    assert _advisory(backend, key, 0) == 1  # the head holds the queue
    assert in_thread(lambda: backend.lock(name, ttl=30).acquire(timeout=0.5)) is False
    holder.release()
    thread.join(30)
    assert box["token"] == first + 1
    for seed in (0, first, first + 1):
        assert _advisory(backend, key, seed) == 0  # nothing left behind
    again = backend.lock(name, ttl=30)
    assert again.acquire(blocking=False)
    again.release()


def test_postgres_a_first_attempt_does_not_pass_a_queued_waiter(unique) -> None:
    """A free lock with a waiter at the head of its queue goes to that waiter, not a newcomer."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique()
    first = backend.lock(name, ttl=30)
    assert first.acquire(blocking=False)  # creates the row
    first.release()
    # A side connection stands for a waiter at the head of the queue.
    with psycopg.connect(**psycopg_params("pg"), autocommit=True) as head:
        head.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [first.key])
        assert not backend.lock(name, ttl=30).acquire(blocking=False)
        head.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [first.key])
    newcomer = backend.lock(name, ttl=30)
    assert newcomer.acquire(blocking=False)
    newcomer.release()


def test_postgres_release_from_another_thread_gives_back_the_generation_lock(unique) -> None:
    """The generation lock lives on the acquiring thread's session: a release from another
    thread goes through that session when it is idle, and leaves the lock to it when busy."""
    require_pg()
    backend = locks["pg-lease"]
    idle = backend.lock(unique("idle"), ttl=30)
    assert idle.acquire()
    in_thread(idle.release)
    assert _advisory(backend, idle.key, 1) == 0
    busy = backend.lock(unique("busy"), ttl=30)
    assert busy.acquire()
    session = busy.backend_state.session
    with session.mutex:  # the acquiring thread is in the middle of a statement
        in_thread(busy.release)
    assert not busy.held and session.orphans == [(busy.key, 1)]
    assert _advisory(backend, busy.key, 1) == 1
    assert not backend.is_locked(busy.name)  # the session's next statement gives it back
    assert _advisory(backend, busy.key, 1) == 0 and session.orphans == []
    assert backend.lock(busy.name, ttl=30).acquire(blocking=False)


def test_postgres_waiter_served_after_force_release_and_expiry(unique) -> None:
    """A head whose holder never gives its generation lock back still gets the lock:
    after a force-release (within a second) and when an abandoned lease ends."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    waiter = backend.lock(name, ttl=30)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(got=waiter.acquire(timeout=20)))
    thread.start()
    assert _eventually(lambda: _advisory(backend, holder.key, 1, granted=False) == 1)
    assert backend.force_release(name)
    thread.join(20)
    assert result["got"] and waiter.fencing_token == 2
    with pytest.raises(LockLost):
        holder.release()  # gives its generation lock back all the same
    assert _advisory(backend, holder.key, 1) == 0
    in_thread(waiter.release)

    abandoned = backend.lock(name, ttl=0.5)
    assert abandoned.acquire()  # never released: its session keeps the generation lock
    late = backend.lock(name, ttl=30)
    assert in_thread(lambda: late.acquire(timeout=20))
    assert late.fencing_token == abandoned.fencing_token + 1
    with pytest.raises(LockLost):
        abandoned.release()
    in_thread(late.release)
