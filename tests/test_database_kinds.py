"""Read-write locks and semaphores of the database backend's lease mode, PostgreSQL and
SQLite: mutual exclusion from recorded histories of forked processes, crashed holders
freeing their share at its TTL, writers not starved, limits stored on the name,
listing of every holder, force release, fencing and async acquires; on PostgreSQL,
hand-offs woken by the release (no poll) and one call per operation."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest

from django_distlock import locks
from django_distlock.exceptions import LockLost, SemaphoreLimitMismatch, UnsupportedOperation
from django_distlock.testing import HistoryRecorder, check, load

from .conftest import (
    LIBRARY_DB,
    advisory_locks,
    eventually,
    in_thread,
    needs_pg,
    require_alias,
)
from .histories import FORK, done, fork_ready, run_forked

pytestmark = [pytest.mark.second_env, LIBRARY_DB]
ALIASES = ["sqlite-lease", "pg-lease", "mysql-lease"]
WORKERS = 8


@pytest.fixture(params=ALIASES)
def alias(request: pytest.FixtureRequest) -> str:
    require_alias(request.param)
    return str(request.param)


def _take(factory: Any) -> bool:
    """Whether another thread gets the handle ``factory()`` builds at once (released)."""
    def run() -> bool:
        handle = factory()
        got = handle.acquire(blocking=False)
        if got:
            handle.release()
        return bool(got)

    return bool(in_thread(run))


# -- mutual exclusion: recorded histories of forked processes ----------------------------


def _worker(alias: str, name: str, path: str, mode: str, rounds: int, start: Any,
            out: Any) -> None:
    recorder = HistoryRecorder(path)
    backend = locks[alias]
    index = os.getpid() % 3
    start.wait()
    for round_ in range(rounds):
        if mode == "semaphore":
            handle = backend.semaphore(name, 3, ttl=30, timeout=60)
        else:  # readers, writers and exclusive locks of one name, mixed
            kind = ("read", "write", "read", "exclusive")[(index + round_) % 4]
            handle = {"read": backend.read_lock, "write": backend.write_lock,
                      "exclusive": backend.lock}[kind](name, ttl=30, timeout=60)
        with recorder.hold(handle):
            time.sleep(0.005)
    recorder.close()
    out.put(os.getpid())
    done()


@pytest.mark.parametrize("mode", ["read-write", "semaphore"])
def test_forked_processes_never_overlap(alias: str, mode: str, unique, tmp_path) -> None:
    """8 processes: readers overlap only readers, a writer (or ``lock()``) nothing, and
    never more than the limit of permits at once (the history checker's rules)."""
    path = str(tmp_path / "history.jsonl")
    rounds = 6
    _, exitcodes = run_forked(_worker, (alias, unique(mode), path, mode, rounds), WORKERS)
    assert exitcodes == [0] * WORKERS
    events = load(path)
    report = check(events)
    report.raise_if_bad()
    assert report.holds == WORKERS * rounds and report.processes == WORKERS
    granted = [e for e in events if e["ev"] == "granted"]
    assert len(granted) == WORKERS * rounds  # no acquire failed or timed out


# -- crashed holders: each share ends at its own TTL -------------------------------------


def _hold(alias: str, name: str, kind: str, ttl: float, ready: Any) -> None:
    backend = locks[alias]
    handle = (backend.semaphore(name, 1, ttl=ttl) if kind == "semaphore"
              else getattr(backend, f"{kind}_lock")(name, ttl=ttl))
    assert handle.acquire(timeout=10)
    ready.set()
    time.sleep(600)


def _killed_holder(alias: str, name: str, kind: str, ttl: float) -> None:
    fork_ready()
    ready = FORK.Event()
    proc = FORK.Process(target=_hold, args=(alias, name, kind, ttl, ready))
    proc.start()
    assert ready.wait(30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


def test_a_sigkilled_holder_frees_its_share_at_its_ttl(alias: str, unique) -> None:
    """A reader, a writer and a permit holder SIGKILLed (each on a name of its own, their
    TTLs running together): each share stays counted until its TTL, then frees."""
    backend = locks[alias]
    started = time.monotonic()
    others = {}
    for kind in ("read", "write", "semaphore"):
        name = unique(f"crash-{kind}")
        _killed_holder(alias, name, kind, ttl=3.0)
        others[kind] = (name, {"read": lambda n=name: backend.write_lock(n),
                               "write": lambda n=name: backend.read_lock(n),
                               "semaphore": lambda n=name: backend.semaphore(n, 1)}[kind])
    for kind, (name, other) in others.items():
        assert not _take(other), kind  # the dead holder's share is still counted
        if needs_pg(alias) and kind != "write":  # its session's hold of the bell went with it
            assert eventually(lambda n=name: advisory_locks(backend, backend.make_key(n), -4)
                              == 0), kind
    for kind, (_, other) in others.items():
        handle = other()
        assert handle.acquire(timeout=10), kind
        assert time.monotonic() - started >= 2.9, kind  # freed by its TTL, on the server's clock
        handle.release()


def test_each_readers_lease_ends_on_its_own(alias: str, unique) -> None:
    """A dead reader's share ends at its TTL while a live reader keeps the name; then the
    live reader's release lets the writer in."""
    backend = locks[alias]
    name = unique("readers")
    alive = backend.read_lock(name, ttl=30)
    assert alive.acquire()
    _killed_holder(alias, name, "read", ttl=1.0)
    time.sleep(1.5)  # the dead reader's lease has ended
    assert backend.is_locked(name)
    assert not _take(lambda: backend.write_lock(name))
    [info] = backend.held_locks(prefix=name).locks
    assert info.kind == "read" and info.owner == alive.owner_id
    alive.release()
    assert not backend.is_locked(name)
    assert _take(lambda: backend.write_lock(name))


# -- fairness --------------------------------------------------------------------------


def test_a_waiting_writer_is_not_starved_by_a_stream_of_readers(alias: str, unique) -> None:
    backend = locks[alias]
    name = unique("starve")
    first = backend.read_lock(name, ttl=30)
    assert first.acquire()
    served: list[str] = []

    def write() -> None:
        with backend.write_lock(name, timeout=20):
            served.append("writer")
            time.sleep(0.05)

    writer = threading.Thread(target=write)
    writer.start()
    # The writer missed and waits (marked the name; on PostgreSQL, heads its queue).
    assert eventually(lambda: not _take(lambda: backend.read_lock(name)))
    late = []
    for i in range(4):
        assert not _take(lambda: backend.read_lock(name))  # kept out by the waiting writer

        def read(i: int = i) -> None:
            with backend.read_lock(name, timeout=20):
                served.append(f"reader{i}")

        late.append(threading.Thread(target=read))
        late[-1].start()
    time.sleep(0.3)
    assert served == []
    first.release()
    writer.join(20)
    for thread in late:
        thread.join(20)
    assert served[0] == "writer" and sorted(served[1:]) == [f"reader{i}" for i in range(4)]


def test_a_writer_that_gives_up_lets_readers_in(alias: str, unique) -> None:
    backend = locks[alias]
    name = unique("gives-up")
    with backend.read_lock(name):
        assert in_thread(lambda: backend.write_lock(name).acquire(timeout=0.3)) is False
        assert _take(lambda: backend.read_lock(name))  # its mark was withdrawn


# -- kinds against each other, limits, fencing, listing, force release ------------------


def test_lock_and_write_lock_exclude_each_other_and_share_fencing(alias: str, unique) -> None:
    backend = locks[alias]
    name = unique("fence")
    with backend.lock(name) as exclusive:
        assert not _take(lambda: backend.write_lock(name))
        assert not _take(lambda: backend.read_lock(name))
        first = exclusive.fencing_token
    with backend.write_lock(name) as writer:
        assert not _take(lambda: backend.lock(name))
        assert writer.fencing_token > first
        [info] = backend.held_locks(prefix=name).locks
        assert info.kind == "write" and info.owner == writer.owner_id
        second = writer.fencing_token
    with backend.read_lock(name) as reader:
        assert not _take(lambda: backend.lock(name))
        assert reader.fencing_token > second
        third = reader.fencing_token
    with backend.lock(name) as exclusive:
        assert exclusive.fencing_token > third


def test_semaphores_and_read_locks_of_one_name_exclude_each_other(alias: str, unique) -> None:
    backend = locks[alias]
    name = unique("mixed")
    with backend.semaphore(name, 3):
        assert not _take(lambda: backend.read_lock(name))
    with backend.read_lock(name):
        assert not _take(lambda: backend.semaphore(name, 3))


def test_a_semaphore_limit_is_stored_on_the_name(alias: str, unique) -> None:
    backend = locks[alias]
    name = unique("limit")
    held = backend.semaphore(name, 2)
    assert held.acquire()
    with pytest.raises(SemaphoreLimitMismatch, match=r"is 2; this client gave 3") as exc:
        backend.semaphore(name, 3).acquire(blocking=False)
    assert (exc.value.stored, exc.value.given) == (2, 3)
    with pytest.raises(SemaphoreLimitMismatch):
        backend.semaphore(name, 1, timeout=2).acquire()
    assert _take(lambda: backend.semaphore(name, 2))
    held.release()
    assert _take(lambda: backend.semaphore(name, 3))  # no permit held: a new limit binds


def test_listing_and_force_release_of_shares(alias: str, unique) -> None:
    backend = locks[alias]
    name = unique("list")
    readers = [backend.read_lock(name, ttl=30 + i) for i in range(3)]
    for reader in readers:
        assert reader.acquire()
    # Every reader is listed, each with its own owner, fencing token and expiry.
    infos = backend.held_locks(prefix=name).locks
    assert [(i.kind, i.owner, i.fencing_token, i.expires_at) for i in infos] == [
        ("read", r.owner_id, r.fencing_token, infos[n].expires_at) for n, r in enumerate(readers)]
    assert all(i.name == name and i.host and i.pid == os.getpid() for i in infos)
    assert infos[0].expires_at < infos[1].expires_at < infos[2].expires_at
    assert backend.force_release(name, owner=readers[2].owner_id)
    with pytest.raises(LockLost):
        readers[2].release()
    assert [i.owner for i in backend.held_locks(prefix=name).locks] == [
        readers[0].owner_id, readers[1].owner_id]
    readers[1].release()
    [info] = backend.held_locks(prefix=name).locks
    assert info.owner == readers[0].owner_id
    assert not _take(lambda: backend.write_lock(name))
    assert backend.force_release(name)  # every reader
    assert not backend.is_locked(name)
    with pytest.raises(LockLost):
        readers[0].extend()
    permits = [backend.semaphore(name + "/s", 2) for _ in range(2)]
    assert all(permit.acquire() for permit in permits)
    assert [(i.kind, i.owner) for i in backend.held_locks(prefix=name + "/s").locks] == [
        ("semaphore", permit.owner_id) for permit in permits]
    for permit in permits:
        permit.release()
    assert backend.held_locks(prefix=name).locks == []


def test_a_share_is_extended_on_its_own(alias: str, unique) -> None:
    backend = locks[alias]
    name = unique("extend")
    short = backend.read_lock(name, ttl=2)
    long = backend.read_lock(name, ttl=2)
    assert short.acquire() and long.acquire()
    long.extend(30)
    time.sleep(2.5)
    with pytest.raises(LockLost):
        short.extend()
    assert not _take(lambda: backend.write_lock(name))
    long.release()
    assert _take(lambda: backend.write_lock(name))


def test_transaction_mode_has_no_kinds() -> None:
    for alias in ("sqlite-tx", "pg-tx", "mysql-tx"):
        require_alias(alias)
        backend = locks[alias]
        assert not backend.supports_read_write and not backend.supports_semaphore
        with pytest.raises(UnsupportedOperation):
            backend.read_lock("x")


# -- async -----------------------------------------------------------------------------


def test_async_acquires_of_each_kind(alias: str, unique) -> None:
    backend = locks[alias]
    name = unique("async")

    async def main() -> tuple[int, int, int]:
        readers = writers = 0
        peak_readers = peak_writers = peak_permits = 0
        permits = 0

        async def read() -> None:
            nonlocal readers, peak_readers
            async with backend.read_lock(name, timeout=20):
                readers += 1
                peak_readers = max(peak_readers, readers)
                assert writers == 0
                await asyncio.sleep(0.05)
                readers -= 1

        async def write() -> None:
            nonlocal writers, peak_writers
            async with backend.write_lock(name, timeout=20):
                writers += 1
                peak_writers = max(peak_writers, writers)
                assert readers == 0
                await asyncio.sleep(0.02)
                writers -= 1

        async def permit() -> None:
            nonlocal permits, peak_permits
            async with backend.semaphore(name + "/s", 2, timeout=20):
                permits += 1
                peak_permits = max(peak_permits, permits)
                await asyncio.sleep(0.05)
                permits -= 1

        await asyncio.gather(read(), read(), read(), write(), write(), read(),
                             *(permit() for _ in range(5)))
        return peak_readers, peak_writers, peak_permits

    peak_readers, peak_writers, peak_permits = asyncio.run(main())
    assert peak_writers == 1 and peak_permits <= 2 and peak_readers >= 1
    assert not backend.is_locked(name) and not backend.is_locked(name + "/s")


def test_auto_renew_keeps_a_share_past_its_ttl(alias: str, unique) -> None:
    backend = locks[alias]
    name = unique("renew")
    with backend.read_lock(name, ttl=2, auto_renew=True) as reader, \
            backend.semaphore(name + "/s", 1, ttl=2, auto_renew=True) as permit:
        time.sleep(3.0)  # both renewed every third of their ttl
        assert not reader.lost and not permit.lost
        assert not _take(lambda: backend.write_lock(name))
        assert not _take(lambda: backend.semaphore(name + "/s", 1))
    assert _take(lambda: backend.write_lock(name))


def test_decorator_kinds(alias: str, unique) -> None:
    from django_distlock import distlock

    backend = locks[alias]
    name = unique("decorated")
    seen: list[tuple[str, bool]] = []

    @distlock(name, using=alias, kind="read")
    def read() -> None:
        seen.append(("read", _take(lambda: backend.read_lock(name))))
        seen.append(("write", _take(lambda: backend.write_lock(name))))

    @distlock(name, using=alias, kind="write")
    def write() -> None:
        seen.append(("read", _take(lambda: backend.read_lock(name))))

    @distlock(name + "/sem", using=alias, kind="semaphore", limit=2)
    def permit() -> None:
        seen.append(("second permit", _take(lambda: backend.semaphore(name + "/sem", 2))))

    read()
    write()
    permit()
    assert seen == [("read", True), ("write", False), ("read", False), ("second permit", True)]
