"""The ZooKeeper backend against the 3-node ensemble that scripts/test starts: the
shipped contract (plain and with digest auth), round trips, watches, names, listing,
fencing across a re-created parent, orphans, session states, options and checks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.conf import settings
from django.core import checks
from django.test import override_settings
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionLoss, NoAuthError

from django_distlock import locks, signals
from django_distlock.backends.zookeeper import ZooKeeperBackend
from django_distlock.backends.zookeeper.errors import ZOOKEEPER_ERRORS
from django_distlock.backends.zookeeper.paths import contenders, decode, encode
from django_distlock.exceptions import (
    BackendUnavailable,
    InvalidBackendOptions,
    LockLost,
    SemaphoreLimitMismatch,
    TooManyLocks,
    UnsupportedOperation,
)
from django_distlock.handle import hold_of
from django_distlock.testing import LockContract

from .conftest import eventually, in_thread, require_zookeeper

pytestmark = pytest.mark.second_env  # CONTRIBUTING.md, the tiers

HOSTS = os.environ.get("DISTLOCK_ZK_HOSTS", "")


class ZooKeeperContract(LockContract):
    @pytest.fixture(autouse=True)
    def _zookeeper(self) -> None:
        require_zookeeper()


class TestZooKeeper(ZooKeeperContract):
    alias = "zk"


class TestZooKeeperAuth(ZooKeeperContract):
    alias = "zk-auth"


def _children(backend: ZooKeeperBackend, name: str) -> list[str]:
    parent = backend.parent_of(backend.make_key(name))
    kazoo = backend.client.get()
    return sorted(kazoo.get_children(parent)) if kazoo.exists(parent) else []


def _acquire_release(backend: ZooKeeperBackend, name: str) -> bool:
    handle = backend.lock(name)
    got = handle.acquire(blocking=False)
    if got:
        handle.release()
    return got


# -- round trips and watches ------------------------------------------------------


def test_uncontended_acquire_release_is_three_round_trips(zk, unique, monkeypatch) -> None:
    """create + get_children + delete; kazoo's Lock adds an exists() of the parent."""
    name = unique()
    with zk.lock(name):  # creates the parent
        pass
    kazoo = zk.client.get()
    sent: list[str] = []
    real = kazoo._call
    monkeypatch.setattr(kazoo, "_call", lambda req, res: sent.append(type(req).__name__)
                        or real(req, res))
    for _ in range(3):
        with zk.lock(name):
            pass
    assert sent == ["Create2", "GetChildren", "Delete"] * 3


def test_one_watch_event_per_release(zk, unique) -> None:
    """5 waiters queue behind a holder; each release wakes exactly one of them."""
    name = unique()
    holder = zk.lock(name)
    holder.acquire()
    order: list[int] = []

    def wait(i: int) -> None:
        with zk.lock(name, timeout=30):
            order.append(i)
            time.sleep(0.02)

    before = zk.client.watch_events
    threads = []
    for i in range(5):
        threads.append(threading.Thread(target=wait, args=(i,)))
        threads[-1].start()
        assert eventually(lambda i=i: len(_children(zk, name)) == i + 2)  # queued in order
    holder.release()
    for thread in threads:
        thread.join(30)
    assert order == [0, 1, 2, 3, 4]  # first come, first served
    assert zk.client.watch_events - before == 5


@pytest.mark.parametrize("shared", [False, True])
def test_the_next_waiter_is_granted_by_the_delete_event(zk, unique, monkeypatch, shared):
    """A waiter with only the holder ahead takes the lock when the holder's node goes,
    without listing the contenders again (later contenders queue behind it). It watches
    its own node too (sent with the holder's watch), so the events' order shows that its
    node outlived the holder's. A holder in the waiter's own session proves nothing (a
    closed session deletes both nodes in one change): the waiter reads its node once."""
    name = unique()
    waiting = zk if shared else _another(zk, "zk-waiter")
    holder = zk.lock(name)
    holder.acquire()
    kazoo = waiting.client.get()
    sent: list[str] = []
    real = kazoo._call
    monkeypatch.setattr(kazoo, "_call", lambda req, res: sent.append(type(req).__name__)
                        or real(req, res))
    got = threading.Event()

    def wait() -> None:
        with waiting.lock(name, timeout=30):
            got.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    queued = ["Create2", "GetChildren", "Exists", "Exists"]  # our node's watch, the holder's
    assert eventually(lambda: sent == queued)
    holder.release()
    waiter.join(30)
    assert got.is_set()
    if shared:
        assert sent == [*queued, "Delete", "Exists", "Delete"]
    else:
        assert sent == [*queued, "Delete"]
        waiting.close()


@pytest.mark.parametrize("kind", ["lock", "read_lock"])
def test_a_waiter_is_not_granted_when_a_waiter_ahead_gives_up(zk, unique, kind) -> None:
    """holder, writer W waiting, then X waiting for W: W's timeout deletes W's node (X's
    watch fires) while the holder still holds: X waits on (it is not next)."""
    name = unique()
    holder = zk.lock(name)
    holder.acquire()
    later = getattr(zk, kind)(name, timeout=30)
    with ThreadPoolExecutor(2) as pool:
        gave_up = pool.submit(lambda: zk.lock(name, timeout=1.5).acquire())
        assert eventually(lambda: len(_children(zk, name)) == 2)
        got = pool.submit(later.acquire)
        assert eventually(lambda: len(_children(zk, name)) == 3)
        assert gave_up.result(10) is False
        assert eventually(lambda: len(_children(zk, name)) == 2)
        time.sleep(0.2)
        assert not later.held
        holder.release()
        assert got.result(10) is True
    later.release()


# -- fencing, parents, names ------------------------------------------------------


def test_fencing_grows_after_the_parent_is_recreated(zk, unique) -> None:
    name = unique()
    with zk.lock(name) as first:
        pass
    parent = zk.parent_of(zk.make_key(name))
    kazoo = zk.client.get()
    kazoo.delete(parent)  # as ZooKeeper's container reaper does (test_zookeeper_faults)
    with zk.lock(name) as second:
        assert kazoo.exists(parent) is not None
    assert second.fencing_token > first.fencing_token


@pytest.mark.parametrize(
    "key", ["a/b", ".", "..", "zookeeper", "%2F", "a%b", "sp ace", "ü✓", "x\x1fy", "\ue000"]
)
def test_names_encode_injectively(key) -> None:
    name = encode(key)
    assert "/" not in name and name not in (".", "..", "zookeeper")
    assert decode(name) == key


def test_node_names_are_readable(zk, unique) -> None:
    name = unique("stock/sku-1")
    with zk.lock(name):
        names = zk.client.get().get_children(zk.settings.root)
        assert encode("z:" + name) in names
        assert "z:stock%2Fsku-1:" in encode("z:" + name)
        assert zk.held_locks(prefix=name).locks[0].name == name


def test_listing_shows_holder_and_waiters(zk, unique) -> None:
    name = unique()
    handle = zk.lock(name)
    handle.acquire()
    waiters = [threading.Thread(target=lambda: zk.lock(name, timeout=1).acquire())
               for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    try:
        assert eventually(lambda: len(_children(zk, name)) == 3)
        [info] = zk.held_locks(prefix=name).locks
        assert info.waiters == 2 and info.owner == handle.owner_id
        assert info.pid == os.getpid() and info.fencing_token == handle.fencing_token
        assert info.expires_at is None and info.thread == handle.holder.thread
    finally:
        handle.release()
        for waiter in waiters:
            waiter.join(5)


def test_listing_pages_skip_empty_parents(zk, unique) -> None:
    base = unique("pages")
    handles = [zk.lock(f"{base}/{i}") for i in range(5)]
    for handle in handles:
        handle.acquire()
    handles[1].release()  # its parent stays (until reaped), empty
    handles[3].release()
    try:
        seen, cursor = [], None
        while True:
            page = zk.held_locks(prefix=base + "/", limit=2, cursor=cursor)
            seen.extend(info.name for info in page)
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == [f"{base}/{i}" for i in (0, 2, 4)]
    finally:
        for i in (0, 2, 4):
            handles[i].release()


# -- what kazoo issue 732 is about: no orphan contender ------------------------------


def test_a_create_whose_answer_is_lost_adopts_its_node(zk, unique, monkeypatch) -> None:
    """The create happened on the server but the answer was lost: the retry finds the
    node by its GUID instead of making a second one (which would block the lock)."""
    name = unique()
    real = zk.client.wait
    lost = []

    def wait(result: Any, what: str, until: float | None = None) -> Any:
        value = real(result, what, until)
        if what == "creating a contender node" and not lost:
            lost.append(value)
            raise ZOOKEEPER_ERRORS.translate(ConnectionLoss()) from ConnectionLoss()
        return value

    monkeypatch.setattr(zk.client, "wait", wait)
    with zk.lock(name):
        assert len(lost) == 1
        assert len(_children(zk, name)) == 1
    assert _children(zk, name) == []


def test_a_failed_delete_is_swept_on_reconnection(zk, unique, monkeypatch) -> None:
    name = unique()
    holder = zk.lock(name)
    holder.acquire()
    real = zk.client.call

    def call(what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if what == "deleting our node":
            raise ZOOKEEPER_ERRORS.translate(ConnectionLoss()) from ConnectionLoss()
        return real(what, method, *args, **kwargs)

    monkeypatch.setattr(zk.client, "call", call)
    with pytest.raises(BackendUnavailable, match="connection to ZooKeeper was lost"):
        in_thread(lambda: zk.lock(name).acquire(timeout=0.2))
    assert zk.client.orphans
    assert len(_children(zk, name)) == 2  # the waiter's node is left: an orphan
    monkeypatch.setattr(zk.client, "call", real)
    zk.client._state_changed(KazooState.CONNECTED)  # reconnected: swept
    assert eventually(lambda: len(_children(zk, name)) == 1)
    holder.release()
    assert in_thread(lambda: _acquire_release(zk, name))


# -- the session ----------------------------------------------------------------------


def test_expired_session_marks_the_holder_lost(zk, unique) -> None:
    """A real session expiry (kazoo's harness way: another client closes the session)."""
    name = unique()
    seen = []
    receiver = lambda sender, **kw: seen.append(kw["name"])  # noqa: E731
    signals.lock_lost.connect(receiver, weak=False)
    try:
        handle = zk.lock(name)
        handle.acquire()
        session, password = zk.client.get().client_id
        other = KazooClient(hosts=HOSTS, client_id=(session, password))
        other.start(timeout=10)
        other.stop()
        other.close()
        assert eventually(lambda: handle.lost)
        assert seen.count(name) == 1
        assert in_thread(lambda: zk.lock(name).acquire(timeout=5))  # freed
        with pytest.raises(LockLost):
            handle.release()
    finally:
        signals.lock_lost.disconnect(receiver)


def test_suspended_marks_the_holder_unsure(zk, unique) -> None:
    name = unique()
    with zk.lock(name) as handle:
        assert hold_of(handle).unsure is False
        zk.client._state_changed(KazooState.SUSPENDED)
        assert hold_of(handle).unsure is True and not handle.lost
        zk.client._state_changed(KazooState.CONNECTED)
        assert hold_of(handle).unsure is False and handle.held


def test_forked_child_gets_its_own_session(zk, unique) -> None:
    name = unique()
    with zk.lock(name):
        parent_session = zk.client.get().client_id[0]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never touch the parent's session
            code = 1
            try:
                other = zk.lock(name + "/child")
                got = other.acquire(timeout=5) and zk.client.get().client_id[0] != parent_session
                other.release()
                code = 0 if got and not zk.lock(name).acquire(blocking=False) else 2
            finally:
                os.write(write, bytes([code]))
                os._exit(code)
        os.close(write)
        assert os.read(read, 1) == b"\x00"
        os.waitpid(pid, 0)
        assert zk.client.get().client_id[0] == parent_session  # still ours
        assert zk.is_locked(name)


# -- ACLs --------------------------------------------------------------------------------


def test_other_clients_cannot_delete_authenticated_nodes(unique) -> None:
    require_zookeeper()
    backend = locks["zk-auth"]
    name = unique()
    with backend.lock(name):
        parent = backend.parent_of(backend.make_key(name))
        stranger = KazooClient(hosts=HOSTS)
        stranger.start(timeout=10)
        try:
            with pytest.raises(NoAuthError):
                stranger.get_children(parent)
            [node] = backend.client.get().get_children(parent)
            with pytest.raises(NoAuthError):
                stranger.delete(f"{parent}/{node}")
        finally:
            stranger.stop()
            stranger.close()


# -- options and checks -----------------------------------------------------------------

_ZK = "django_distlock.backends.zookeeper.ZooKeeperBackend"


def _backend(location: Any = "127.0.0.1:2181", **options: Any) -> ZooKeeperBackend:
    return ZooKeeperBackend("x", {"BACKEND": _ZK, "LOCATION": location, "OPTIONS": options})


@pytest.mark.parametrize(
    ("location", "options", "check_id"),
    [
        ("", {}, "distlock.E020"),
        ("zk1:2181,,zk2", {}, "distlock.E020"),
        ("zk1:99999", {}, "distlock.E020"),
        ("zk1:2181/", {}, "distlock.E020"),
        ("zk1 zk2", {}, "distlock.E020"),
        ("zk1:2181", {"ROOT": "relative"}, "distlock.E021"),
        ("zk1:2181", {"ROOT": "/a/"}, "distlock.E021"),
        ("zk1:2181", {"ROOT": "/a/../b"}, "distlock.E021"),
        ("zk1:2181", {"ROOT": "/zookeeper/locks"}, "distlock.E021"),
        ("zk1:2181", {"SESSION_TIMEOUT": 1}, "distlock.E022"),
        ("zk1:2181", {"SESSION_TIMEOUT": 100}, "distlock.E022"),
    ],
)
def test_checks_and_refusal_before_any_call(location, options, check_id) -> None:
    backend = _backend(location, **options)
    [message] = backend.check()
    assert message.id == check_id and isinstance(message, checks.Error)
    with pytest.raises(InvalidBackendOptions):  # no server is reached (none is there)
        backend.lock("a").acquire(blocking=False)
    with pytest.raises(InvalidBackendOptions):
        backend.health()


def test_good_settings_have_no_check_messages() -> None:
    assert _backend("zk1:2181,zk2:2182,[::1]:2183/app/chroot", ROOT="/a/b",
                    SESSION_TIMEOUT=30).check() == []


@pytest.mark.parametrize(
    "options",
    [
        {"NOPE": 1},
        {"SESSION_TIMEOUT": "10"},
        {"SESSION_TIMEOUT": 0},
        {"AUTH": "user:pass"},
        {"AUTH": ("us:er", "pass")},
        {"ACL": [("digest", "a:b", ["EVERYTHING"])]},
        {"CLIENT_OPTIONS": {"hosts": "other:2181"}},
        {"CLIENT_OPTIONS": []},
        {"MAX_SESSION_BYTES": 100},
        {"MAX_SESSION_BYTES": "1MB"},
        {"MAX_SESSION_BYTES": 1.5e6},
    ],
)
def test_bad_option_types_are_refused(options) -> None:
    with pytest.raises(InvalidBackendOptions):
        _backend(**options)


def test_system_check_reports_through_the_registry() -> None:
    config = {"default": {"BACKEND": _ZK, "LOCATION": "zk1:2181", "OPTIONS": {"ROOT": "x"}}}
    with override_settings(DISTLOCK=config):
        from django_distlock.checks import check_distlock

        assert [m.id for m in check_distlock()] == ["distlock.E021"]


def test_unreachable_ensemble_is_a_clear_error_in_time() -> None:
    backend = _backend("127.0.0.1:1", CONNECT_TIMEOUT=0.5)
    started = time.monotonic()
    with pytest.raises(Exception, match="did not answer in time") as info:
        backend.lock("a").acquire(blocking=False)
    assert time.monotonic() - started < 3
    assert info.value.__cause__ is not None


# -- read-write locks -----------------------------------------------------------------


def _try(handle_factory: Any) -> bool:
    """Whether another thread gets the lock at once (and gives it back)."""
    def run() -> bool:
        handle = handle_factory()
        got = handle.acquire(blocking=False)
        if got:
            handle.release()
        return bool(got)

    return bool(in_thread(run))


def test_readers_share_and_writers_exclude(zk, unique) -> None:
    name = unique()
    first, second = zk.read_lock(name), zk.read_lock(name)
    assert first.acquire(blocking=False) and second.acquire(timeout=2)  # one thread, waiting
    assert _try(lambda: zk.read_lock(name))
    assert not _try(lambda: zk.write_lock(name))
    assert not _try(lambda: zk.lock(name))  # lock() is the write side too
    assert zk.is_locked(name)
    first.release()
    second.release()
    with zk.write_lock(name) as writer:
        assert writer.kind == "write" and isinstance(writer.fencing_token, int)
        assert not _try(lambda: zk.read_lock(name))
        assert not _try(lambda: zk.write_lock(name))
    assert _try(lambda: zk.write_lock(name))


def test_a_writer_is_not_starved_by_a_stream_of_readers(zk, unique) -> None:
    name = unique()
    reader = zk.read_lock(name)
    reader.acquire()
    served: list[str] = []

    def write() -> None:
        with zk.write_lock(name, timeout=20):
            served.append("writer")
            time.sleep(0.05)

    writer = threading.Thread(target=write)
    writer.start()
    assert eventually(lambda: len(_children(zk, name)) == 2)
    late_readers = []
    for i in range(5):  # readers keep coming while the first one holds
        assert not _try(lambda: zk.read_lock(name))  # queued behind the writer: no barging

        def read(i: int = i) -> None:
            with zk.read_lock(name, timeout=20):
                served.append(f"reader{i}")

        late_readers.append(threading.Thread(target=read))
        late_readers[-1].start()
    assert eventually(lambda: len(_children(zk, name)) == 7)
    assert served == []
    reader.release()
    writer.join(20)
    for thread in late_readers:
        thread.join(20)
    assert served[0] == "writer" and sorted(served[1:]) == [f"reader{i}" for i in range(5)]


def test_readers_behind_a_writer_are_woken_together(zk, unique) -> None:
    name = unique()
    writer = zk.write_lock(name)
    writer.acquire()
    inside = threading.Barrier(4, timeout=10)  # 3 readers and this test
    threads = []
    for _ in range(3):
        def read() -> None:
            with zk.read_lock(name, timeout=20):
                inside.wait()  # all three hold it at once
                inside.wait()

        threads.append(threading.Thread(target=read))
        threads[-1].start()
    assert eventually(lambda: len(_children(zk, name)) == 4)
    writer.release()
    inside.wait()
    [info] = zk.held_locks(prefix=name).locks
    assert info.kind == "read" and info.waiters == 0
    inside.wait()
    for thread in threads:
        thread.join(10)


def test_listing_shows_the_kind_and_who_waits(zk, unique) -> None:
    name = unique()
    with zk.read_lock(name), zk.read_lock(name):
        waiter = threading.Thread(target=lambda: zk.write_lock(name, timeout=1).acquire())
        waiter.start()
        assert eventually(lambda: len(_children(zk, name)) == 3)
        [info] = zk.held_locks(prefix=name).locks
        assert info.kind == "read" and info.waiters == 1
        waiter.join(5)
    with zk.lock(name):
        assert zk.held_locks(prefix=name).locks[0].kind == "exclusive"


def test_read_write_locks_are_refused_where_unsupported() -> None:
    backend = locks["locmem"]
    assert backend.supports_read_write is False
    with pytest.raises(UnsupportedOperation):
        backend.read_lock("x")
    with pytest.raises(UnsupportedOperation):
        backend.write_lock("x")


# -- semaphores --------------------------------------------------------------------------


def _max_concurrency(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    level = peak = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        level += step
        peak = max(peak, level)
    return peak


def test_max_concurrency_can_see_overlaps() -> None:
    assert _max_concurrency([(0, 2), (1, 3), (1.5, 4), (3.5, 5)]) == 3
    assert _max_concurrency([(0, 1), (1, 2)]) == 1


def test_a_semaphore_never_exceeds_its_limit(zk, unique) -> None:
    """Nine threads take 36 holds of a semaphore of three between them; a holder waits,
    holding, until three hold (a barrier), so the limit is reached at every hold whatever
    the ensemble's speed, and passing it would show as a fourth overlapping hold. (Holds
    of a fixed 20 ms reached the limit only where a grant takes under 7 ms: on a slow
    host, grants 25 ms apart through one session overlapped two at a time.)"""
    name = unique("sem")
    intervals: list[tuple[float, float]] = []
    tokens: list[int] = []
    failures: list[BaseException] = []
    holds = queue.SimpleQueue[int]()
    for hold in range(36):  # a multiple of three: the last barrier fills too
        holds.put(hold)
    full = threading.Barrier(3, timeout=30)

    def work() -> None:
        # A thread takes a hold only after its last one ended: while holds are left, at
        # least three threads want one, so every barrier fills.
        try:
            while True:
                try:
                    holds.get_nowait()
                except queue.Empty:
                    return
                with zk.semaphore(name, 3, timeout=60) as lease:
                    began = time.monotonic()
                    tokens.append(lease.fencing_token)
                    full.wait()  # three hold now
                    intervals.append((began, time.monotonic()))
        except BaseException as exc:  # a broken barrier: three never held at once
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    assert len(intervals) == 36 and len(set(tokens)) == 36
    assert _max_concurrency(intervals) == 3  # reached, never passed
    assert not zk.is_locked(name)


def test_semaphore_at_its_limit(zk, unique) -> None:
    name = unique("sem")
    held = [zk.semaphore(name, 2) for _ in range(2)]
    for lease in held:
        assert lease.acquire(blocking=False)
    assert not _try(lambda: zk.semaphore(name, 2))
    parent = zk.parent_of(zk.make_key(name))
    kazoo = zk.client.get()
    assert kazoo.get_children(f"{parent}/__gate__") == []  # the miss left the gate
    waiter = threading.Thread(target=lambda: zk.semaphore(name, 2, timeout=1).acquire())
    waiter.start()
    assert eventually(lambda: len(kazoo.get_children(f"{parent}/__gate__")) == 1)
    [info] = zk.held_locks(prefix=name).locks
    assert info.kind == "semaphore" and info.waiters == 1
    waiter.join(5)
    held[0].release()
    assert _try(lambda: zk.semaphore(name, 2))
    held[1].release()


def _another(zk: ZooKeeperBackend, alias: str) -> ZooKeeperBackend:
    """Another client (a session of its own) of the same locks as ``zk``."""
    return ZooKeeperBackend(alias, settings.DISTLOCK[zk.alias])


def test_a_semaphore_limit_is_stored_on_the_server(zk, unique) -> None:
    """The first use stores the limit in the semaphore's node; a client passing another
    limit is refused before it takes a lease (it would over-admit), the same one works."""
    name = unique("sem")
    other = _another(zk, "other")
    try:
        with zk.semaphore(name, 2):
            parent = zk.parent_of(zk.make_key(name))
            assert zk.client.get().get(parent)[0] == b"2"
            before = _children(zk, name)
            with pytest.raises(SemaphoreLimitMismatch, match=r"is 2; this client gave 1") as exc:
                other.semaphore(name, 1).acquire(blocking=False)
            assert (exc.value.stored, exc.value.given) == (2, 1)
            with pytest.raises(SemaphoreLimitMismatch):
                other.semaphore(name, 3, timeout=5).acquire()
            assert _children(zk, name) == before  # no lease taken
            assert zk.client.get().get_children(f"{parent}/__gate__") == []
            assert _try(lambda: other.semaphore(name, 2))
    finally:
        other.close()


def test_a_process_reads_a_semaphores_limit_once(zk, unique, monkeypatch) -> None:
    """Later acquisitions of a semaphore whose limit this process found stored skip
    reading it (the gate holder's listing still shows a changed node)."""
    name = unique("sem")
    with zk.semaphore(name, 2):  # stores and remembers the limit
        pass
    kazoo = zk.client.get()
    sent: list[str] = []
    real = kazoo._call
    monkeypatch.setattr(kazoo, "_call", lambda req, res: sent.append(type(req).__name__)
                        or real(req, res))
    with zk.semaphore(name, 2):
        pass
    assert "GetData" not in sent and sent.count("GetChildren") >= 1
    sent.clear()
    with pytest.raises(SemaphoreLimitMismatch):  # another limit is read and compared
        zk.semaphore(name, 3).acquire(blocking=False)
    assert sent[0] == "GetData"


def test_the_gate_holder_checks_the_limit_again_when_the_node_changed(zk, unique) -> None:
    """A waiter at the limit holds the gate; the node's data changing meanwhile (as when
    the container is reaped and re-created by a client with another limit) is seen in
    its listing, and it is refused instead of taking a lease."""
    name = unique("sem")
    parent = zk.parent_of(zk.make_key(name))
    kazoo = zk.client.get()
    holder = zk.semaphore(name, 1)
    holder.acquire()
    waiter = zk.semaphore(name, 1, timeout=20)
    with ThreadPoolExecutor(1) as pool:
        outcome = pool.submit(waiter.acquire)
        assert eventually(lambda: len(kazoo.get_children(f"{parent}/__gate__")) == 1)
        kazoo.set(parent, b"3")
        holder.release()
        with pytest.raises(SemaphoreLimitMismatch, match="is 3; this client gave 1"):
            outcome.result(20)
    assert not waiter.held
    assert [c for c in kazoo.get_children(parent) if "__lease__" in c] == []
    assert kazoo.get_children(f"{parent}/__gate__") == []


def test_clients_first_using_a_semaphore_at_once_store_one_limit(zk, unique) -> None:
    """Two clients creating the semaphore together: one limit is stored, the other
    client compares against it."""
    name = unique("sem")
    backends = [_another(zk, f"b{index}") for index in range(4)]
    parent = zk.parent_of(zk.make_key(name))
    outcomes: dict[int, bytes | None] = {}  # the stored limit a holder saw; None: refused
    start = threading.Barrier(len(backends))

    def use(index: int) -> None:
        backend = backends[index]
        start.wait()
        try:
            with backend.semaphore(name, 1 + index % 2, timeout=10):
                outcomes[index] = backend.client.get().get(parent)[0]
        except SemaphoreLimitMismatch:
            outcomes[index] = None

    try:
        for backend in backends:
            backend.client.get()
        threads = [threading.Thread(target=use, args=(i,)) for i in range(len(backends))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(outcomes) == len(backends)
        stored = {limit for limit in outcomes.values() if limit is not None}
        assert len(stored) == 1  # one limit won, and every holder saw it
        limit = int(stored.pop())
        assert {i for i, seen in outcomes.items() if seen is not None} == {
            i for i in range(len(backends)) if 1 + i % 2 == limit
        }
    finally:
        for backend in backends:
            backend.close()


def test_semaphore_arguments() -> None:
    require_zookeeper()
    zk = locks["zk"]
    for bad in (0, -1, 10_001):
        with pytest.raises(ValueError):
            zk.semaphore("s", bad)
    for bad_type in ("3", 2.5, True, None):
        with pytest.raises(TypeError):
            zk.semaphore("s", bad_type)
    with pytest.raises(UnsupportedOperation):
        locks["locmem"].semaphore("s", 2)


def test_semaphore_async(zk, unique) -> None:
    import asyncio

    name = unique("sem")

    async def main() -> int:
        inside = 0
        peak = 0

        async def one() -> None:
            nonlocal inside, peak
            async with zk.semaphore(name, 2, timeout=20):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.05)
                inside -= 1

        await asyncio.gather(*(one() for _ in range(6)))
        return peak

    assert asyncio.run(main()) == 2


# -- the decorator form of each kind ------------------------------------------------------


def test_decorator_kinds(zk, unique) -> None:
    from django_distlock import distlock

    name = unique()
    seen: list[tuple[str, bool]] = []

    @distlock(name, using="zk", kind="read")
    def read() -> None:
        seen.append(("read", _try(lambda: zk.read_lock(name))))  # readers share
        seen.append(("write", _try(lambda: zk.write_lock(name))))

    @distlock(name, using="zk", kind="write")
    def write() -> None:
        seen.append(("read", _try(lambda: zk.read_lock(name))))

    @distlock(name + "/sem", using="zk", kind="semaphore", limit=2)
    def lease() -> None:
        seen.append(("second lease", _try(lambda: zk.semaphore(name + "/sem", 2))))

    read()
    write()
    lease()
    assert seen == [("read", True), ("write", False), ("read", False), ("second lease", True)]

    @distlock(name, using="locmem", kind="read")
    def unsupported() -> None:
        pass

    with pytest.raises(UnsupportedOperation):
        unsupported()
    with pytest.raises(ValueError):
        distlock(name, kind="shared")(lambda: None)
    with pytest.raises(ValueError):
        distlock(name, kind="semaphore")(lambda: None)
    with pytest.raises(ValueError):
        distlock(name, limit=3)(lambda: None)


def test_write_side_of_a_name_the_thread_reads_is_a_self_deadlock(zk, unique) -> None:
    from django_distlock import SelfDeadlock

    name = unique()
    with zk.read_lock(name):
        started = time.monotonic()
        with pytest.raises(SelfDeadlock):
            zk.write_lock(name).acquire(timeout=5)
        assert time.monotonic() - started < 2


# -- the session's size ---------------------------------------------------------------


def _hold_briefly(backend: ZooKeeperBackend, name: str) -> bool:
    handle = backend.lock(name, timeout=10)
    got = handle.acquire()
    if got:
        handle.release()
    return got


def test_a_session_is_kept_under_max_session_bytes(unique) -> None:
    """The end of a session writes one transaction naming all its ephemeral nodes; past
    about 2 MB it breaks a 3.6+ ensemble (ZOOKEEPER-4306, seen here with 40,000 locks
    in one session). The backend refuses the node that would pass MAX_SESSION_BYTES,
    before sending it; waiters' nodes count; a release makes room again."""
    require_zookeeper()
    backend = ZooKeeperBackend("sized", {
        "BACKEND": _ZK, "LOCATION": HOSTS, "OPTIONS": {"MAX_SESSION_BYTES": 1024},
    })
    other = ZooKeeperBackend("other", {"BACKEND": _ZK, "LOCATION": HOSTS})
    base = unique("")
    held = []
    try:
        with pytest.raises(TooManyLocks, match="MAX_SESSION_BYTES"):
            for index in range(100):
                handle = backend.lock(f"{base}{index:03d}", timeout=1)
                handle.acquire()
                held.append(handle)
        assert 5 <= len(held) < 100 and backend.client.claimed <= 1024
        assert _children(backend, f"{base}{len(held):03d}") == []  # nothing was created
        held.pop().release()  # room for one node
        busy, outcome = f"{base}busy", []
        with other.lock(busy):  # held elsewhere: waiting for it needs a node of our own
            full = backend.client.claimed
            waiter = threading.Thread(target=lambda: outcome.append(_hold_briefly(backend, busy)))
            waiter.start()
            assert eventually(lambda: backend.client.claimed > full)
            with pytest.raises(TooManyLocks):
                backend.lock(f"{base}x").acquire(blocking=False)
        waiter.join()
        assert outcome == [True]  # granted once the other let go, then released
        held.append(backend.lock(f"{base}x"))
        assert held[-1].acquire(blocking=False)
    finally:
        for handle in held:
            handle.release()
        backend.close()
        other.close()
    assert backend.client.claimed == 0


# -- a grant rests on our own node, in the live session (issue 20, item 1) -------------


def _node_of(backend: ZooKeeperBackend, name: str, handle: Any) -> str | None:
    """The contender node behind ``handle``'s grant (its czxid is the fencing token), if
    it exists now in ``backend``'s live session (seen through the ``zk`` alias' client)."""
    assert eventually(backend.client.connected)
    session = backend.client.get().client_id[0]
    observer = locks["zk"]
    assert isinstance(observer, ZooKeeperBackend)
    parent = observer.parent_of(observer.make_key(name))
    kazoo = observer.client.get()
    # Another client's reads may come from a server that has not applied the grant's
    # create yet (a node made in the backend's new session, after the old one was closed,
    # read as missing: CI once). ``sync`` brings the observer's server up to the leader.
    kazoo.sync(parent)
    for child in kazoo.get_children(parent) if kazoo.exists(parent) else []:
        stat = kazoo.exists(f"{parent}/{child}")
        if stat is not None and stat.czxid == handle.fencing_token:
            return child if stat.ephemeralOwner == session else None
    return None


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_waiter_whose_node_was_deleted_is_not_granted_on_it(zk, unique, mode) -> None:
    """B waits behind A in a session of its own; another client deletes B's node; A
    releases. B's grant must not rest on the deleted node (it queues again, with a new
    node), and C's non-blocking acquire must not be granted beside B."""
    name = unique()
    waiting, third = _another(zk, "zk-b"), _another(zk, "zk-c")
    try:
        holder = zk.lock(name)
        assert holder.acquire()
        waiter = waiting.lock(name, timeout=10)
        run = waiter.acquire if mode == "sync" else lambda: asyncio.run(waiter.aacquire())
        with ThreadPoolExecutor(1) as pool:
            got = pool.submit(run)
            assert eventually(lambda: len(_children(zk, name)) == 2)
            parent = zk.parent_of(zk.make_key(name))
            deleted = contenders(_children(zk, name))[1]
            zk.client.get().delete(f"{parent}/{deleted}")  # an operator, or Curator's tests
            holder.release()
            assert got.result(10) is True
        assert _node_of(waiting, name, waiter) not in (None, deleted)  # a new node
        assert not _try(lambda: third.lock(name))  # C is not granted beside B
        waiter.release()
        assert _try(lambda: third.lock(name))
    finally:
        waiting.close()
        third.close()


def test_no_grant_without_a_node_when_the_shared_session_is_closed(zk, unique) -> None:
    """Holders and their waiters share one client; the session is closed on the server
    (kazoo's harness way), which deletes all their nodes at once. A holder's delete event
    can reach its waiter before the client sees the session end: no waiter may be granted
    on its deleted node (before the fix: about 1 in 10)."""
    backend = _another(zk, "zk-shared")
    names = [unique(f"n{index}") for index in range(5)]
    bogus = []
    try:
        for _round in range(20):
            holders = [backend.lock(name) for name in names]
            for handle in holders:
                assert handle.acquire(timeout=5)
            waiters = [backend.lock(name, timeout=5) for name in names]
            with ThreadPoolExecutor(len(names)) as pool:
                futures = [pool.submit(waiter.acquire) for waiter in waiters]
                assert eventually(lambda: all(len(_children(zk, n)) == 2 for n in names))
                session, password = backend.client.get().client_id
                closer = KazooClient(hosts=HOSTS, client_id=(session, password))
                closer.start(timeout=10)
                closer.stop()
                closer.close()
                for name, waiter, future in zip(names, waiters, futures, strict=True):
                    try:
                        granted = future.result(15)
                    except BackendUnavailable:
                        granted = False
                    if granted:
                        if _node_of(backend, name, waiter) is None:
                            bogus.append(name)
                        with contextlib.suppress(LockLost):
                            waiter.release()
            for handle in holders:
                with contextlib.suppress(LockLost):
                    handle.release()
        assert bogus == []
    finally:
        backend.close()


def test_a_node_found_by_guid_in_another_session_is_not_adopted(zk, unique, monkeypatch):
    """CURATOR-604: a create's answer is lost and the session changes; a node with our
    GUID still listed belongs to the ended session (here: another live one). Adopting it
    would grant on a node this session does not own."""
    name = unique()
    parent = zk.parent_of(zk.make_key(name))
    stranger = KazooClient(hosts=HOSTS)
    stranger.start(timeout=10)
    real = zk.client.wait
    lost: list[str] = []

    def wait(result: Any, what: str, until: float | None = None) -> Any:
        value = real(result, what, until)
        if what == "creating a contender node" and not lost:
            path = value[0]
            lost.append(path)
            zk.client.get().delete(path)  # our node went with our (old) session...
            guid = path.rsplit("/", 1)[1].partition("__")[0]
            # ...and a node named by our GUID, of another session, is still listed.
            stranger.create(f"{parent}/{guid}__lock__", ephemeral=True, sequence=True)
            raise ZOOKEEPER_ERRORS.translate(ConnectionLoss()) from ConnectionLoss()
        return value

    monkeypatch.setattr(zk.client, "wait", wait)
    try:
        handle = zk.lock(name)
        assert handle.acquire(blocking=False) is False  # the stranger's node is ahead
        assert lost
        assert len(contenders(_children(zk, name))) == 1  # ours was deleted again
    finally:
        stranger.stop()
        stranger.close()


# -- a chroot in LOCATION (issue 20, item 14) -------------------------------------------


@pytest.mark.parametrize("chroot_exists", [True, False])
def test_a_chroot_in_location_holds_every_node(unique, chroot_exists) -> None:
    """``LOCATION`` ending in ``/some/chroot``: locks and semaphores work, every node is
    made under the chroot (created when missing), and a node outside the chroot with the
    path of ``ROOT`` is left untouched. Before: the lock's parent was made outside the
    chroot, or (no such node outside) "ZooKeeper kept removing the parents"."""
    require_zookeeper()
    tag = unique("c").replace(":", "-")
    top = f"/distlock-{tag}"
    chroot, root = f"{top}/some/chroot", f"/locks-{tag}"
    raw = KazooClient(hosts=HOSTS)
    raw.start(timeout=10)
    try:
        if chroot_exists:
            raw.ensure_path(chroot)
            raw.create(root)  # outside the chroot
        backend = ZooKeeperBackend("chroot", {
            "BACKEND": _ZK, "LOCATION": HOSTS + chroot, "OPTIONS": {"ROOT": root},
        })
        assert backend.check() == []
        try:
            with backend.lock("x"):
                assert raw.get_children(f"{chroot}{root}") == ["x"]
                assert len(raw.get_children(f"{chroot}{root}/x")) == 1
                assert not _try(lambda: backend.lock("x"))
                assert [info.name for info in backend.held_locks().locks] == ["x"]
            with backend.semaphore("s", 2), backend.semaphore("s", 2):
                assert not _try(lambda: backend.semaphore("s", 2))
                assert sorted(raw.get_children(f"{chroot}{root}")) == ["s", "x"]
            assert backend.health() >= 0
            # Nothing made outside the chroot.
            assert (raw.get_children(root) if chroot_exists else raw.exists(root)) in ([], None)
        finally:
            backend.close()
    finally:
        raw.delete(top, recursive=True)
        if raw.exists(root):
            raw.delete(root, recursive=True)
        raw.stop()
        raw.close()
