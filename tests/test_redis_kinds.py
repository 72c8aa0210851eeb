"""Redis read-write locks and semaphores (one server and Redis Cluster): mutual
exclusion from recorded histories of forked processes, shares that end at their own
TTL when their holder is SIGKILLed, a writer not starved by readers, async, listing,
force release, the stored semaphore limit. The shipped contract's kind checks run in
tests/test_backend_redis.py."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from redis.cluster import key_slot

from django_distlock import locks
from django_distlock.exceptions import LockLost, SemaphoreLimitMismatch
from django_distlock.testing.history import HistoryRecorder, check, load

from .conftest import require_redis
from .histories import FORK, fork_ready, run_forked

ALIASES = ["redis", "redis-cluster"]


@pytest.fixture(params=ALIASES)
def alias(request: pytest.FixtureRequest) -> str:
    require_redis(cluster=request.param == "redis-cluster")
    return str(request.param)


def unique(label: str) -> str:
    return f"kinds/{label}/{os.urandom(6).hex()}"


# -- mutual exclusion from recorded histories of 8 processes -----------------------------


def _rw_worker(alias: str, name: str, path: str, rounds: int, start: Any, out: Any) -> None:
    rec, rng = HistoryRecorder(path), random.Random(os.getpid())
    start.wait()
    backend = locks[alias]
    for _ in range(rounds):
        write = rng.random() < 0.3
        handle = backend.write_lock(name, ttl=30) if write else backend.read_lock(name, ttl=30)
        with rec.hold(handle):
            if write:  # only writers write: readers' tokens are not ordered among them
                rec.write(name, handle.fencing_token, accepted=True)
            time.sleep(rng.uniform(0.001, 0.006))
    rec.close()
    out.put(rounds)
    locks.close_all()


def _semaphore_worker(
    alias: str, name: str, path: str, rounds: int, start: Any, out: Any
) -> None:
    rec, rng = HistoryRecorder(path), random.Random(os.getpid())
    start.wait()
    for _ in range(rounds):
        with rec.hold(locks[alias].semaphore(name, 3, ttl=30)):
            time.sleep(rng.uniform(0.001, 0.006))
    rec.close()
    out.put(rounds)
    locks.close_all()


def _most_at_once(events: list[dict[str, Any]], kind: str) -> int:
    """The most holds of ``kind`` that were granted and not yet released at one time."""
    kinds = {e["op"]: e["kind"] for e in events if e["ev"] == "invoke"}
    most = now = 0
    for e in events:
        if kinds.get(e.get("op")) != kind:
            continue
        if e["ev"] == "granted":
            now += 1
            most = max(most, now)
        elif e["ev"] == "released":
            now -= 1
    return most


@pytest.mark.parametrize("kind", ["read-write", "semaphore"])
def test_histories_of_eight_processes_hold_the_kinds_promises(
    alias: str, kind: str, tmp_path: Path
) -> None:
    """Writers overlap nothing, readers no writer, never more than 3 permits: the
    shipped checker on 8 processes' recorded holds; readers (permits) did share."""
    path, name, workers, rounds = tmp_path / "h.jsonl", unique(kind), 8, 25
    target = _rw_worker if kind == "read-write" else _semaphore_worker
    results, exitcodes = run_forked(target, (alias, name, str(path), rounds), workers)
    assert exitcodes == [0] * workers and sum(results) == workers * rounds
    events = load(path)
    report = check(events)
    report.raise_if_bad()
    assert report.holds == workers * rounds and report.processes == workers
    shared = _most_at_once(events, "read" if kind == "read-write" else "semaphore")
    assert shared > 1, "the holders never shared the name: the test saw no concurrency"
    if kind == "semaphore":
        assert shared <= 3
    assert not locks[alias].is_locked(name)


def test_the_checker_sees_a_reader_overlapping_a_writer(tmp_path: Path) -> None:
    """The history check used above can fail: a write hold overlapping a read hold."""
    rec = HistoryRecorder(tmp_path / "h.jsonl")
    reader, writer = rec.invoke("n", "read"), rec.invoke("n", "write")
    rec.granted(reader, token=1)
    rec.granted(writer, token=2)
    rec.released(reader)
    rec.released(writer)
    rec.close()
    assert len(check(load(tmp_path / "h.jsonl")).overlaps) == 1


# -- a SIGKILLed holder frees its share at its TTL ---------------------------------------


def _hold_and_hang(alias: str, name: str, kind: str, ready: Any) -> None:
    backend = locks[alias]
    handle = {
        "read": lambda: backend.read_lock(name, ttl=1.5),
        "write": lambda: backend.write_lock(name, ttl=1.5),
        "semaphore": lambda: backend.semaphore(name, 2, ttl=1.5),
    }[kind]()
    assert handle.acquire(timeout=10)
    ready.set()
    time.sleep(600)


def _killed_holder(alias: str, name: str, kind: str) -> float:
    """Fork a process that takes ``kind`` of ``name`` with a 1.5 s lease, SIGKILL it
    once it holds; return when it got the grant (monotonic, about)."""
    fork_ready()
    ready = FORK.Event()
    proc = FORK.Process(target=_hold_and_hang, args=(alias, name, kind, ready))
    proc.start()
    try:
        assert ready.wait(30), "the child did not get its share"
        granted = time.monotonic()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    return granted


def test_a_killed_reader_frees_its_share_at_its_ttl_not_the_others(alias: str) -> None:
    backend, name = locks[alias], unique("killed-reader")
    alive = backend.read_lock(name, ttl=30)
    assert alive.acquire(blocking=False)
    granted = _killed_holder(alias, name, "read")
    assert {i.kind for i in backend.held_locks(prefix=name)} == {"read"}
    assert len(backend.held_locks(prefix=name).locks) == 2
    time.sleep(max(granted + 1.6 - time.monotonic(), 0))
    rows = backend.held_locks(prefix=name).locks
    assert len(rows) == 1 and rows[0].fencing_token == alive.fencing_token
    writer = backend.write_lock(name)
    assert not writer.acquire(blocking=False), "the live reader's share is kept"
    alive.release()
    started = time.monotonic()
    assert writer.acquire(blocking=False), "the dead reader's share ended at its own TTL"
    assert time.monotonic() - started < 1
    writer.release()
    assert not backend.is_locked(name)


def test_a_killed_writer_frees_the_name_at_its_ttl(alias: str) -> None:
    backend, name = locks[alias], unique("killed-writer")
    granted = _killed_holder(alias, name, "write")
    assert [i.kind for i in backend.held_locks(prefix=name)] == ["write"]
    reader = backend.read_lock(name)
    assert not reader.acquire(blocking=False)
    assert reader.acquire(timeout=10)
    assert time.monotonic() - granted >= 1.0  # not before the lease could end
    reader.release()


def test_a_killed_permit_holder_gives_its_permit_back_at_its_ttl(alias: str) -> None:
    backend, name = locks[alias], unique("killed-permit")
    alive = backend.semaphore(name, 2, ttl=30)
    assert alive.acquire(blocking=False)
    granted = _killed_holder(alias, name, "semaphore")
    third = backend.semaphore(name, 2)
    assert not third.acquire(blocking=False), "both permits are held"
    assert third.acquire(timeout=10), "the dead holder's permit came back"
    assert time.monotonic() - granted >= 1.0
    assert alive.held and len(backend.held_locks(prefix=name).locks) == 2
    third.release()
    alive.release()
    assert not backend.is_locked(name)


# -- fairness: a waiting writer is not starved; readers behind it get in together --------


def test_a_waiting_writer_is_not_starved_by_later_readers(alias: str) -> None:
    backend, name = locks[alias], unique("starve")
    first = backend.read_lock(name, ttl=30)
    assert first.acquire(blocking=False)
    order: list[str] = []
    writer = backend.write_lock(name, ttl=30)

    def write() -> None:
        assert writer.acquire(timeout=15)
        order.append("writer")
        time.sleep(0.2)
        writer.release()

    def read(i: int) -> None:
        handle = backend.read_lock(name, ttl=30)
        assert handle.acquire(timeout=15)
        order.append(f"reader {i}")
        time.sleep(0.05)
        handle.release()

    threads = [threading.Thread(target=write)]
    threads[0].start()
    time.sleep(0.3)  # the writer waits, queued
    # A reader arriving now is refused although only readers hold the name...
    assert not backend.read_lock(name).acquire(blocking=False)
    # ...and a stream of readers waits behind the writer.
    for i in range(6):
        threads.append(threading.Thread(target=read, args=(i,)))
        threads[-1].start()
        time.sleep(0.05)
    time.sleep(0.2)
    assert order == []
    first.release()
    for thread in threads:
        thread.join(30)
    assert order[0] == "writer" and len(order) == 7
    assert not backend.is_locked(name)


def test_readers_queued_behind_a_writer_share_once_it_releases(alias: str) -> None:
    backend, name = locks[alias], unique("batch")
    writer = backend.write_lock(name, ttl=30)
    assert writer.acquire(blocking=False)
    readers = [backend.read_lock(name, ttl=30) for _ in range(4)]
    got: list[float] = []
    both = threading.Barrier(4, timeout=10)

    def read(handle: Any) -> None:
        assert handle.acquire(timeout=10)
        got.append(time.monotonic())
        both.wait()  # every reader holds at once
        handle.release()

    threads = [threading.Thread(target=read, args=(h,)) for h in readers]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    released = time.monotonic()
    writer.release()
    for thread in threads:
        thread.join(15)
    assert len(got) == 4 and max(got) - released < 0.5, "woken in a chain, not by polling"


# -- async ---------------------------------------------------------------------------------


def test_async_readers_share_and_a_writer_waits(alias: str) -> None:
    backend, name = locks[alias], unique("async")

    async def main() -> None:
        one, two = backend.read_lock(name), backend.read_lock(name)
        assert await one.aacquire(blocking=False) and await two.aacquire(blocking=False)
        writer = backend.write_lock(name)
        waiting = asyncio.ensure_future(writer.aacquire(timeout=10))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await one.arelease()
        await asyncio.sleep(0.1)
        assert not waiting.done()
        started = time.monotonic()
        await two.arelease()
        assert await waiting and time.monotonic() - started < 0.5
        assert not await backend.semaphore(name, 1).aacquire(blocking=False)
        await writer.arelease()
        permits = [backend.semaphore(name, 2) for _ in range(3)]
        assert await permits[0].aacquire(blocking=False)
        assert await permits[1].aacquire(blocking=False)
        third = asyncio.ensure_future(permits[2].aacquire(timeout=10))
        await asyncio.sleep(0.2)
        assert not third.done()
        await permits[0].arelease()
        assert await third
        await permits[1].arelease()
        await permits[2].arelease()

    asyncio.run(main())
    assert not backend.is_locked(name)


@pytest.mark.parametrize("kind", ["read", "write", "semaphore"])
def test_a_cancelled_aacquire_leaves_nothing_held(alias: str, kind: str) -> None:
    backend, name = locks[alias], unique(f"cancel-{kind}")
    blocker = backend.write_lock(name) if kind != "write" else backend.read_lock(name)
    if kind == "semaphore":
        blocker = backend.semaphore(name, 1)

    def make() -> Any:
        if kind == "semaphore":
            return backend.semaphore(name, 1)
        return backend.read_lock(name) if kind == "read" else backend.write_lock(name)

    async def main() -> None:
        assert await blocker.aacquire(blocking=False)
        handle = make()
        task = asyncio.ensure_future(handle.aacquire(timeout=10))
        await asyncio.sleep(0.2)
        await blocker.arelease()  # the wake-up and the grant race the cancellation
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            await handle.arelease()
        assert not handle.held

    asyncio.run(main())
    assert not backend.is_locked(name)
    # nobody is left queued ahead: a newcomer gets it at once
    fresh = make()
    assert fresh.acquire(blocking=False)
    fresh.release()


# -- renewal, listing, force release, the stored limit -------------------------------


@pytest.mark.parametrize("kind", ["read", "write", "semaphore"])
def test_auto_renew_keeps_a_share_past_its_ttl(alias: str, kind: str) -> None:
    backend, name = locks[alias], unique(f"renew-{kind}")
    options: dict[str, Any] = {"ttl": 0.6, "auto_renew": True}
    handle = {
        "read": lambda: backend.read_lock(name, **options),
        "write": lambda: backend.write_lock(name, **options),
        "semaphore": lambda: backend.semaphore(name, 1, **options),
    }[kind]()
    token = None
    with handle:
        token = handle.fencing_token
        time.sleep(1.5)
        assert handle.held and not handle.lost
        assert not backend.write_lock(name).acquire(blocking=False)
        assert handle.fencing_token == token
    assert not backend.is_locked(name)


def test_listing_shows_readers_writer_and_permits(alias: str) -> None:
    backend, base = locks[alias], unique("listing")
    readers = [backend.read_lock(f"{base}/r", ttl=30) for _ in range(2)]
    writer = backend.write_lock(f"{base}/w", ttl=30)
    permit = backend.semaphore(f"{base}/s", 4, ttl=30)
    for handle in (*readers, writer, permit):
        assert handle.acquire(blocking=False)
    rows = backend.held_locks(prefix=base).locks
    assert sorted((r.name, r.kind) for r in rows) == [
        (f"{base}/r", "read"), (f"{base}/r", "read"), (f"{base}/s", "semaphore"),
        (f"{base}/w", "write"),
    ]
    tokens = {r.fencing_token for r in rows}
    assert tokens == {h.fencing_token for h in (*readers, writer, permit)}
    assert all(r.pid == os.getpid() and r.expires_at is not None for r in rows)
    for handle in (*readers, writer, permit):
        handle.release()
    assert backend.held_locks(prefix=base).locks == []


def test_force_release_frees_one_owners_share_or_the_whole_name(alias: str) -> None:
    backend, name = locks[alias], unique("force")
    one, two = backend.read_lock(name, ttl=30), backend.read_lock(name, ttl=30)
    assert one.acquire(blocking=False) and two.acquire(blocking=False)
    rows = backend.held_locks(prefix=name).locks
    owner = next(r.owner for r in rows if r.fencing_token == one.fencing_token)
    assert backend.force_release(name, owner=owner)
    assert [r.fencing_token for r in backend.held_locks(prefix=name)] == [two.fencing_token]
    assert not backend.write_lock(name).acquire(blocking=False)
    assert backend.force_release(name)
    assert not backend.is_locked(name)
    with pytest.raises(LockLost):
        two.release()
    assert not backend.force_release(name)


def test_a_semaphore_client_with_another_limit_is_refused(alias: str) -> None:
    backend, name = locks[alias], unique("limit")
    held = backend.semaphore(name, 2)
    assert held.acquire(blocking=False)
    with pytest.raises(SemaphoreLimitMismatch) as caught:
        backend.semaphore(name, 3).acquire(timeout=1)
    assert (caught.value.stored, caught.value.given) == (2, 3)
    assert not backend.read_lock(name).acquire(blocking=False)
    assert not backend.lock(name).acquire(blocking=False), "a name holds one kind at a time"
    held.release()
    other = backend.semaphore(name, 3)  # nothing held: the limit went with the last permit
    assert other.acquire(blocking=False)
    other.release()


def test_a_write_lock_and_lock_exclude_each_other(alias: str) -> None:
    backend, name = locks[alias], unique("write-lock")
    with backend.lock(name):
        assert not backend.write_lock(name).acquire(blocking=False)
        assert not backend.read_lock(name).acquire(blocking=False)
    with backend.read_lock(name):
        assert not backend.lock(name).acquire(blocking=False)
    with backend.write_lock(name):
        assert not backend.lock(name).acquire(blocking=False)


def test_fencing_tokens_grow_across_writers_and_readers(alias: str) -> None:
    backend, name = locks[alias], unique("fencing")
    tokens = []
    for make in (backend.write_lock, backend.read_lock, backend.write_lock, backend.read_lock):
        with make(name) as handle:
            tokens.append(handle.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


@pytest.mark.parametrize("name", ["{tag}", "a{b}c:{d}", "ünï ✓"])
def test_a_names_share_keys_are_in_its_lock_slot(name: str) -> None:
    require_redis(cluster=True)
    backend = locks["redis-cluster"]
    calls = backend.kind_calls_for(backend.make_key(unique("slot") + name), "read")
    keys = (*calls.acquire.keys, *calls.release.keys, *calls.extend.keys, *calls.leave.keys)
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_listing_and_force_release_with_decoded_replies() -> None:
    """``decode_responses=True``: the shares' rows parse from str replies too."""
    require_redis()
    backend, base = locks["redis-decoded"], unique("decoded")
    reader, permit = backend.read_lock(f"{base}/r"), backend.semaphore(f"{base}/s", 2)
    assert reader.acquire(blocking=False) and permit.acquire(blocking=False)
    rows = sorted(backend.held_locks(prefix=base), key=lambda r: r.name)
    assert [(r.kind, r.fencing_token) for r in rows] == [
        ("read", reader.fencing_token), ("semaphore", permit.fencing_token),
    ]
    assert backend.force_release(f"{base}/s", owner=rows[1].owner)
    assert not backend.is_locked(f"{base}/s")
    reader.release()
