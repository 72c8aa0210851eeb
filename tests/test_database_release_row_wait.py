"""PostgreSQL lease mode: a release outwaits another transaction's hold of the name's row.

Found by the ``scale.handoff`` benchmark (docs/scale.md): under load a release's
``UPDATE`` waited longer than the session's row-lock bound (``ROW_LOCK_WAIT``, 200 ms)
for a waiter's reservation to commit (its commit waits for the WAL flush), and the
release failed with ``BackendUnavailable``, leaving the lock held until its lease ended.
"""

from __future__ import annotations

import threading
import time

import psycopg

from django_distlock import locks

from .conftest import LIBRARY_DB, psycopg_params, require_pg

pytestmark = LIBRARY_DB


def _hold_row(key: str, seconds: float) -> threading.Thread:
    """Hold the row of ``key`` in another session's transaction for ``seconds``."""
    locked = threading.Event()

    def hold() -> None:
        with psycopg.connect(**psycopg_params("pg")) as other:
            other.execute("SELECT 1 FROM django_distlock_lock WHERE name = %s FOR UPDATE", [key])
            locked.set()
            time.sleep(seconds)
            other.commit()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert locked.wait(10)
    return thread


def test_postgres_release_outwaits_a_row_lock_held_past_the_session_bound(unique) -> None:
    require_pg()
    backend = locks["pg-lease"]
    lock = backend.lock(unique("row"), ttl=30)
    assert lock.acquire()
    holder = _hold_row(lock.key, 0.6)  # three times ROW_LOCK_WAIT
    try:
        lock.release()  # was: BackendUnavailable (lock timeout) after 200 ms
    finally:
        holder.join(10)
    assert not lock.held
    assert backend.lock(lock.name, ttl=30).acquire(blocking=False)


def test_postgres_async_release_outwaits_a_row_lock_held_past_the_session_bound(unique
                                                                                ) -> None:
    import asyncio

    require_pg()
    backend = locks["pg-lease"]
    lock = backend.lock(unique("arow"), ttl=30)

    async def take_and_release() -> None:
        assert await lock.aacquire()
        holder = _hold_row(lock.key, 0.6)
        try:
            await lock.arelease()
        finally:
            holder.join(10)

    asyncio.run(take_and_release())
    assert not lock.held
    assert backend.lock(lock.name, ttl=30).acquire(blocking=False)
