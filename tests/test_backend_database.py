"""The contract on the database backend: PostgreSQL and SQLite, lease and transaction modes."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from django_distlock import locks
from django_distlock.backends import _dbsql as sql

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
    cursor = backend._cursor()
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


def test_postgres_waiters_queue_in_the_server(unique) -> None:
    """Blocking waiters in threads queue on an advisory lock; a timed-out one leaves no trace."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    head_waiting = threading.Event()

    def head() -> int | None:
        handle = backend.lock(name, ttl=30)
        head_waiting.set()
        assert handle.acquire(timeout=20)
        token = handle.fencing_token
        handle.release()
        return token  # the thread's lock connection is closed when the thread is collected

    def late() -> bool:
        return backend.lock(name, ttl=30).acquire(timeout=0.5)  # behind the head: times out

    def queue_heads() -> int:
        unsigned = sql.queue_key(holder.key) & 0xFFFFFFFFFFFFFFFF
        cursor = backend._cursor()
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1",
            [unsigned >> 32, unsigned & 0xFFFFFFFF],
        )
        return cursor.fetchone()[0]

    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(token=head()))
    thread.start()
    head_waiting.wait(5)
    deadline = time.monotonic() + 10
    while queue_heads() != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert queue_heads() == 1  # the first waiter heads the queue in the server
    assert in_thread(late) is False
    # A wake-up with the lock still held: the head's attempt misses, and it queues again.
    cursor = backend._cursor()
    cursor.execute("SELECT pg_notify(%s, '')", [sql.queue_channel(holder.key)])
    time.sleep(0.3)
    assert queue_heads() == 1 and thread.is_alive()
    first = holder.fencing_token
    holder.release()
    thread.join(30)
    assert box["token"] == first + 1
    assert queue_heads() == 0
    again = backend.lock(name, ttl=30)
    assert again.acquire(blocking=False)  # the queue was left by both waiters
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
        head.execute("SELECT pg_advisory_lock(%s)", [sql.queue_key(first.key)])
        assert not backend.lock(name, ttl=30).acquire(blocking=False)
        head.execute("SELECT pg_advisory_unlock(%s)", [sql.queue_key(first.key)])
    newcomer = backend.lock(name, ttl=30)
    assert newcomer.acquire(blocking=False)
    newcomer.release()
