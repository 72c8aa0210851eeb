"""PostgreSQL lease mode's read-write locks and semaphores in the server: each operation
one call, a grant that waits for another's row lock, waiters queued in arrival order,
and hand-offs woken by the release (a notification for the queue's head, the shares'
bell for a ``lock()`` waiter), not by a poll. The kinds on both vendors are in
``test_database_kinds.py``."""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

import psycopg

from django_distlock import locks
from django_distlock.backends.database.shares_sql import SQLITE_SHARES

from .conftest import (
    LIBRARY_DB,
    advisory_locks,
    eventually,
    in_thread,
    psycopg_params,
    require_pg,
)
from .test_database_kinds import _take

pytestmark = LIBRARY_DB


def test_postgres_a_grant_waits_for_the_row_lock_of_another_grant(unique) -> None:
    """The first statement of a grant locks the name's row, new or existing (the count of
    live shares that follows is exact only so): a grant meanwhile waits for it (here,
    past the session's row-lock wait: a miss) and is granted once it commits."""
    require_pg()
    backend = locks["pg-lease"]
    for fresh in (True, False):
        name = unique(f"row-lock-{fresh}")
        if not fresh:
            assert _take(partial(backend.read_lock, name))  # the row exists
        key = backend.make_key(name)
        with psycopg.connect(**psycopg_params("pg")) as side:  # a transaction
            side.execute(SQLITE_SHARES.lock_row, {"key": key})  # plain SQL, as the grant's
            started = time.monotonic()
            assert not _take(partial(backend.semaphore, name, 2))
            assert time.monotonic() - started >= 0.2
            side.rollback()
        assert _take(partial(backend.semaphore, name, 2))


def test_postgres_waiters_queue_in_the_server_in_arrival_order(unique) -> None:
    """Waiting readers, writers and permits of a name queue in the server (an advisory
    lock whose head polls, the others sleep behind it): they are served in arrival
    order, and a wait that times out leaves nothing behind."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique("queue")
    key = backend.make_key(name)
    holder = backend.semaphore(name, 1, ttl=30)
    assert holder.acquire()
    served: list[int] = []

    def wait(i: int) -> None:
        with backend.semaphore(name, 1, timeout=30):
            served.append(i)
            time.sleep(0.02)

    threads = []
    for i in range(4):
        threads.append(threading.Thread(target=wait, args=(i,)))
        threads[-1].start()
        assert eventually(lambda i=i: advisory_locks(backend, key, -3)
                          + advisory_locks(backend, key, -3, granted=False) == i + 1)
    assert advisory_locks(backend, key, -3) == 1  # the head; the others sleep behind it
    assert in_thread(lambda: backend.semaphore(name, 1).acquire(timeout=0.3)) is False
    holder.release()
    for thread in threads:
        thread.join(30)
    assert served == [0, 1, 2, 3]
    assert advisory_locks(backend, key, -3) + advisory_locks(backend, key, -3, granted=False) == 0


# -- PostgreSQL: hand-offs woken by the release, one call per operation -------------------


def handed_over(queued: Any, waiter: Any, release: Any) -> float:
    """Start ``waiter`` (an acquire) in a thread, wait until ``queued()`` (it waits in the
    server's queue: then a while longer, it sleeps in its wait), call ``release`` and
    return how long the waiter took to get the lock after it."""
    got: list[float] = []
    thread = threading.Thread(target=lambda: got.append(time.monotonic()) if waiter() else None)
    thread.start()
    assert eventually(queued)
    time.sleep(0.3)
    assert not got  # still waiting
    released = time.monotonic()
    release()
    thread.join(20)
    assert got, "the waiter was not granted"
    return got[0] - released


def test_postgres_a_release_wakes_the_head_without_a_poll(unique, monkeypatch) -> None:
    """The head of a name's queue waits for the release's notification, not a poll: with
    the fallback poll at 30 s (and a holder's lease of 60 s), each hand-off still comes
    at once; the release of a ``lock()`` holder wakes a reader too."""
    require_pg()
    from django_distlock.backends.database import share_acquisition

    monkeypatch.setattr(share_acquisition, "HEAD_POLL", 30.0)
    monkeypatch.setattr(share_acquisition, "INTENT_SECONDS", 60)  # a writer's mark renewal
    backend = locks["pg-lease"]
    name = unique("wake")
    key = backend.make_key(name)
    cases = [  # (holder, waiter)
        (lambda: backend.write_lock(name, ttl=60), lambda: backend.read_lock(name)),
        (lambda: backend.read_lock(name, ttl=60), lambda: backend.write_lock(name)),
        (lambda: backend.semaphore(name, 1, ttl=60), lambda: backend.semaphore(name, 1)),
        (lambda: backend.lock(name, ttl=60), lambda: backend.read_lock(name)),
    ]
    for holder_of, waiter_of in cases:
        holder, waiter = holder_of(), waiter_of()
        assert holder.acquire()
        took = handed_over(lambda: advisory_locks(backend, key, -3) == 1,
                           partial(waiter.acquire, timeout=20), holder.release)
        assert took < 2.0, f"{waiter.kind} waited {took:.2f} s after {holder.kind}'s release"
        waiter.release()


def test_postgres_a_lock_waiter_behind_readers_waits_for_their_bell(unique) -> None:
    """A ``lock()`` waiter behind readers waits in the server for the name's bell, which
    each reader's session holds (shared) until its release: the last release lets it in
    at once, not at its next look a second later."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique("bell")
    key = backend.make_key(name)
    for _ in range(2):
        readers = [backend.read_lock(name, ttl=60) for _ in range(2)]
        assert all(reader.acquire() for reader in readers)
        assert advisory_locks(backend, key, -4) == 1  # held (shared) by this thread's session
        exclusive = backend.lock(name, ttl=30)
        got: list[float] = []

        def wait(exclusive: Any = exclusive, got: list[float] = got) -> None:
            if exclusive.acquire(timeout=20):
                got.append(time.monotonic())

        thread = threading.Thread(target=wait)
        thread.start()
        assert eventually(lambda: advisory_locks(backend, key, -4, granted=False) == 1)
        readers[0].release()
        time.sleep(0.2)
        assert not got  # one reader is left
        released = time.monotonic()
        readers[1].release()
        thread.join(20)
        assert got and got[0] - released < 0.5
        assert advisory_locks(backend, key, -4) + advisory_locks(backend, key, -4, False) == 0
        exclusive.release()


def test_postgres_each_operation_is_one_call(unique) -> None:
    """Each grant, release and extend of a reader, a writer or a permit is one statement
    (a call of a function of migration 0009) on the backend's session."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique("calls")
    counted: list[str] = []
    session = backend.sessions.get()
    execute = session.execute

    def counting(statement: str, params: Any) -> Any:
        counted.append(statement)
        return execute(statement, params)

    session.execute = counting  # type: ignore[method-assign]
    try:
        for handle in (backend.read_lock(name), backend.semaphore(name + "/s", 2),
                       backend.write_lock(name + "/w")):
            for step in (handle.acquire, handle.extend, handle.release):
                counted.clear()
                step()
                assert len(counted) == 1, (handle.kind, step.__name__, counted)
            assert not handle.locked()
    finally:
        del session.execute


def test_postgres_a_share_released_from_another_thread_gives_its_bell_back(unique) -> None:
    """The bell is held by the session that granted the share: a release from another
    thread leaves it to that session, which gives it back before its next statement."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique("orphan-bell")
    key = backend.make_key(name)
    reader = backend.read_lock(name, ttl=30)
    assert reader.acquire()
    in_thread(reader.release)
    assert advisory_locks(backend, key, -4, own_session=True) == 1  # not yet
    assert not backend.is_locked(name)  # a statement on this thread's session
    assert advisory_locks(backend, key, -4) == 0


def test_postgres_a_lock_waiter_behind_a_writer_waits_for_its_generation_lock(unique) -> None:
    """A writer's session takes its grant's generation lock, as an exclusive grant does:
    a ``lock()`` waiter sleeps on it in the server and the writer's release wakes it."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique("writer-generation")
    key = backend.make_key(name)
    writer = backend.write_lock(name, ttl=60)
    assert writer.acquire()
    token = writer.fencing_token
    assert advisory_locks(backend, key, token, own_session=True) == 1
    exclusive = backend.lock(name, ttl=30)
    thread = threading.Thread(target=partial(exclusive.acquire, timeout=20))
    thread.start()
    assert eventually(lambda: advisory_locks(backend, key, token, granted=False) == 1)
    released = time.monotonic()
    writer.release()
    thread.join(20)
    assert time.monotonic() - released < 2.0 and exclusive.fencing_token > token
    assert advisory_locks(backend, key, token) == 0
    exclusive.release()
