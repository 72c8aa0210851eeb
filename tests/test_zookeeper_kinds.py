"""ZooKeeper's reentrant locks (Curator's ``InterProcessMutex`` count, kept in the handle
layer) and the write lock's downgrade to its read side, against the ensemble that
scripts/test starts."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from django_distlock import locks
from django_distlock.backends.zookeeper import ZooKeeperBackend
from django_distlock.exceptions import LockLost, UnsupportedOperation
from django_distlock.testing.contract.support import acquire_release
from django_distlock.testing.history import HistoryRecorder, check, load

from .conftest import eventually, in_thread
from .histories import FORK, done, fork_ready, run_forked


def _children(backend: ZooKeeperBackend, name: str) -> list[str]:
    parent = backend.parent_of(backend.make_key(name))
    try:
        return sorted(backend.client.get().get_children(parent))
    except NoNodeError:
        return []


def test_an_inner_acquire_creates_no_second_node(zk, unique) -> None:
    """Acquiring again (the same handle, or another reentrant handle in the holding
    thread) counts up on the one node; it goes with the last release."""
    name = unique()
    claimed = zk.client.claimed  # bytes of node paths the session holds
    outer = zk.lock(name, reentrant=True)
    assert outer.acquire(blocking=False)
    node = _children(zk, name)
    assert outer.acquire(blocking=False)
    other = zk.lock(name, reentrant=True)
    assert other.acquire(blocking=False)
    assert _children(zk, name) == node and len(node) == 1
    assert other.fencing_token == outer.fencing_token
    outer.release()
    outer.release()
    assert _children(zk, name) == node, "the other handle still holds it"
    other.release()
    assert _children(zk, name) == []
    assert zk.client.claimed == claimed


def test_another_thread_does_not_share_the_node(zk, unique) -> None:
    """The count is the holding thread's: another thread's reentrant handle queues
    behind it with its own node, and is granted at the last release."""
    name = unique()
    held = zk.lock(name, reentrant=True)
    assert held.acquire()
    waiter = zk.lock(name, reentrant=True, timeout=10)
    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(waiter.acquire()))
    thread.start()
    assert eventually(lambda: len(_children(zk, name)) == 2)
    assert held.acquire(blocking=False)  # the holder's count, not the waiter's node
    held.release()
    assert results == [] and len(_children(zk, name)) == 2
    held.release()
    thread.join(10)
    assert results == [True]
    in_thread(waiter.release)
    assert _children(zk, name) == []


def test_a_force_released_hold_counts_on_until_its_last_release(zk, unique) -> None:
    """The count is the handle layer's, as Curator's: an acquire after a force release
    counts on the gone node with no server call (nothing tells a holder of it; the
    name is free for others meanwhile), and the last release finds it gone."""
    name = unique()
    handle = zk.lock(name, reentrant=True)
    assert handle.acquire()
    assert zk.force_release(name)
    assert handle.acquire(blocking=False)
    assert in_thread(lambda: acquire_release(zk, name)) is True
    handle.release()  # an inner count: no call
    with pytest.raises(LockLost):
        handle.release()
    assert handle.lost and not handle.held


def test_an_owner_is_refused_saying_why(zk) -> None:
    """A node belongs to one process' session: handles cannot share it by ``owner``."""
    with pytest.raises(UnsupportedOperation, match="session"):
        zk.lock("x", reentrant=True, owner="job-17")


def test_async_acquisitions_nest_too(zk, unique) -> None:
    name = unique()

    async def main() -> None:
        handle = zk.lock(name, reentrant=True)
        assert await handle.aacquire() and await handle.aacquire(blocking=False)
        assert len(_children(zk, name)) == 1
        await handle.arelease()
        assert zk.is_locked(name)
        await handle.arelease()

    asyncio.run(main())
    assert not zk.is_locked(name)


def test_an_expired_session_ends_every_count_of_the_hold(zk, unique) -> None:
    """Both reentrant handles of the hold are lost with the session; the thread's next
    acquire takes a new node in the new session instead of counting on the gone one."""
    name = unique()
    first = zk.lock(name, reentrant=True)
    second = zk.lock(name, reentrant=True)
    assert first.acquire() and second.acquire()
    session, password = zk.client.get().client_id
    other = KazooClient(hosts=os.environ["DISTLOCK_ZK_HOSTS"], client_id=(session, password))
    other.start(timeout=10)
    other.stop()
    other.close()
    assert eventually(lambda: first.lost and second.lost)
    third = zk.lock(name, reentrant=True)
    assert third.acquire(timeout=5)
    assert len(_children(zk, name)) == 1 and third.fencing_token != first.fencing_token
    third.release()
    for handle in (first, second):
        with pytest.raises(LockLost):
            handle.release()
    assert not zk.is_locked(name)


# -- downgrade: the write holder takes the read side --------------------------------


def _queue_writer(name: str, go: Any, granted: Any) -> None:
    """A child process: once told, wait for the write side of ``name``; note the grant."""
    go.wait(10)
    with locks["zk"].write_lock(name, timeout=30):
        granted.set()
    locks.close_all()


def test_the_write_holder_takes_the_read_side_without_waiting(zk, unique) -> None:
    """With another process' writer queued behind it, the write holder's read lock is
    granted at once; released, the write leaves the read held, and the queued writer
    waits for that read (it is not granted alongside it)."""
    name = unique()
    fork_ready()  # before acquiring: it closes this process' session
    go, granted = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_queue_writer, args=(name, go, granted))
    child.start()
    writer = zk.write_lock(name)
    assert writer.acquire(blocking=False)
    go.set()
    try:
        assert eventually(lambda: len(_children(zk, name)) == 2), "the other writer queued"
        reader = zk.read_lock(name)
        started = time.monotonic()
        assert reader.acquire(timeout=5)
        assert time.monotonic() - started < 1, "the downgrade waited"
        writer.release()
        assert not granted.wait(1), "the queued writer was granted while the read is held"
        assert zk.is_locked(name)
        assert in_thread(lambda: zk.write_lock(name).acquire(blocking=False)) is False
        # A later reader queues behind the waiting writer (writers are not starved).
        assert in_thread(lambda: _take_read(zk, name)) is False
        reader.release()
        assert granted.wait(10), "the queued writer got it after the read was released"
    finally:
        child.join(20)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def _take_read(backend: ZooKeeperBackend, name: str) -> bool:
    handle = backend.read_lock(name)
    got = handle.acquire(blocking=False)
    if got:
        handle.release()
    return got


def test_only_the_write_holder_downgrades(zk, unique) -> None:
    """Another thread's reader waits for the writer (it is not the write holder)."""
    name = unique()
    with zk.write_lock(name):
        assert in_thread(lambda: zk.read_lock(name).acquire(timeout=0.3)) is False
        reader = zk.read_lock(name)
        assert reader.acquire(blocking=False)
    assert zk.is_locked(name)
    reader.release()
    assert not zk.is_locked(name)


def _downgrader(path: Path, name: str, start: Any, out: Any) -> None:
    """One of 8 processes: for a second, take the write side and, every other time,
    downgrade (take the read side, release the write, hold the read a little), or
    take the read side; record every hold (a downgraded read from the write's end)."""
    rec, backend = HistoryRecorder(path), locks["zk"]
    start.wait()
    until, turn = time.monotonic() + 1.0, os.getpid()
    while time.monotonic() < until:
        turn += 1
        if turn % 3 == 0:
            with rec.hold(backend.read_lock(name, timeout=30)):
                time.sleep(0.001)
            continue
        writer = backend.write_lock(name, timeout=30)
        op = rec.invoke(name, "write")
        assert writer.acquire()
        rec.granted(op, writer.fencing_token)
        time.sleep(0.001)
        reader = backend.read_lock(name) if turn % 2 else None
        assert reader is None or reader.acquire(blocking=False), "the downgrade waited"
        rec.released(op)
        writer.release()
        if reader is not None:
            op = rec.invoke(name, "read")
            rec.granted(op, reader.fencing_token)
            time.sleep(0.002)  # others' writers queued meanwhile must wait for it
            rec.released(op)
            reader.release()
    out.put(True)
    done()


def test_downgrades_of_8_processes_never_overlap_a_writer(zk, unique, tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    _, exitcodes = run_forked(_downgrader, (path, unique()), 8, timeout=60)
    assert exitcodes == [0] * 8
    report = check(load(path))
    report.raise_if_bad()
    assert report.processes == 8
