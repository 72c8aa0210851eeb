"""PostgreSQL lease mode: a cancelled task's cancel request reaches its wait, never the
statement after it.

Found by a fresh machine's CI run (issue 32): an ``aacquire()`` cancelled while it
waited in the server starts a thread that asks the server to stop the wait (a
PostgreSQL cancel request, which stops *whatever* the session runs when it arrives).
When the wait was granted meanwhile, its pool thread releases that grant on the same
session, and the request, still on its way, stopped the release: the lease stayed
held by nobody for the rest of its ttl.

The moment is chosen, not hoped for: the cancel thread is held until the release
waits in the server (another transaction holds the name's row), then let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from django_distlock import locks
from django_distlock.backends.database import lease, sessions

from .conftest import LIBRARY_DB, eventually, psycopg_params, require_pg

pytestmark = LIBRARY_DB

ALIAS = "pg-lease"


@contextlib.contextmanager
def _row_held(key: str) -> Iterator[None]:
    """Hold ``key``'s lock row in another session's transaction within the block."""
    with psycopg.connect(**psycopg_params("pg")) as other:
        other.execute("SELECT 1 FROM django_distlock_lock WHERE name = %s FOR UPDATE", [key])
        try:
            yield
        finally:
            other.rollback()


def _release_waits_on_a_row() -> bool:
    """Whether a lease release statement waits for a row lock in the server now."""
    with psycopg.connect(**psycopg_params("pg"), autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
            " AND wait_event_type = 'Lock' AND query LIKE '%%django_distlock_release%%'"
        ).fetchone()
    return bool(row and row[0])


def test_a_cancel_request_never_stops_the_release_of_a_grant_that_came_meanwhile(
    monkeypatch: pytest.MonkeyPatch, unique: Any
) -> None:
    require_pg()
    # The release must sit in the server while the other transaction holds its row, not
    # give up every 200 ms between tries (the request would then find it idle).
    monkeypatch.setattr(sessions, "ROW_LOCK_WAIT", "30s")
    locks.reset()  # a backend whose sessions open with that bound
    backend = locks[ALIAS]
    name = unique("cancel-order")

    settling, row_locked = threading.Event(), threading.Event()
    release_waits, cancelled = threading.Event(), threading.Event()
    real_settle = lease.PgLeaseAcquisition._settle
    real_cancel = sessions.Session.cancel

    def settle(self: lease.PgLeaseAcquisition, outcome: object) -> None:
        settling.set()  # the cancelled task's call ended: it settles a grant now
        row_locked.wait(10)
        real_settle(self, outcome)

    def cancel(self: sessions.Session) -> None:
        # The request leaves when the release waits in the server (before the fix it did
        # then, and stopped it); the fix sends it only while the wait runs, so here it
        # holds up the wait's end until this gives up, and finds the session idle.
        release_waits.wait(3)
        try:
            real_cancel(self)
        finally:
            cancelled.set()

    monkeypatch.setattr(lease.PgLeaseAcquisition, "_settle", settle)
    monkeypatch.setattr(sessions.Session, "cancel", cancel)

    holder = backend.lock(name, ttl=30)
    assert holder.acquire(timeout=5)

    async def cancel_a_waiter() -> None:
        waiter = backend.lock(name, ttl=30)
        task = asyncio.ensure_future(waiter.aacquire(timeout=20))
        for _ in range(500):  # until it waits in the server's queue
            await asyncio.sleep(0.01)
            if await asyncio.to_thread(backend.waiters, name):
                break
        else:
            pytest.fail("the waiter never queued")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(cancel_a_waiter())
        holder.release()  # hands the lock to the cancelled task's wait, still in the server
        assert settling.wait(10)
        with _row_held(holder.key):
            row_locked.set()
            assert eventually(_release_waits_on_a_row, timeout=10)
            release_waits.set()
            assert cancelled.wait(10)
            # The server has taken the request. Give it a moment to act while the row is
            # held: a release it stopped stops waiting; one it did not waits on.
            eventually(lambda: not _release_waits_on_a_row(), timeout=1)
        probe = backend.lock(name, ttl=30)
        assert eventually(lambda: probe.acquire(blocking=False), timeout=5), (
            "the grant that came after the cancel was not released: the name is held by "
            "nobody until its lease ends"
        )
        probe.release()
    finally:
        row_locked.set()
        release_waits.set()
        locks.reset()
