"""The ZooKeeper backend under faults, with real OS processes and real ensembles.

Histories of holds are recorded by worker processes (``CLOCK_MONOTONIC`` is
system-wide on Linux). Holders are SIGKILLed and SIGSTOPped on the shared ensemble;
the tests that kill ZooKeeper servers start a private 3-node ensemble of their own
(``scripts/servers.py``'s functions) so the shared one is never hurt.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_distlock import locks
from django_distlock.backends.zookeeper import ZooKeeperBackend
from django_distlock.exceptions import BackendUnavailable, LockLost
from django_distlock.handle import hold_of

from .conftest import eventually, require_zookeeper
from .figures import record
from .histories import FORK
from .histories import done as _done
from .histories import fork_ready as _fork_ready
from .histories import history as _history
from .histories import overlaps as _overlaps

SESSION_TIMEOUT = 4.0  # the "zk" alias' (tests/settings.py)


# -- mutual exclusion of 8 processes -----------------------------------------------


def test_the_overlap_check_sees_unlocked_workers(unique) -> None:
    require_zookeeper()
    assert _overlaps(_history(None, unique(), workers=8, rounds=5)) != []


def test_eight_processes_never_overlap(unique) -> None:
    require_zookeeper()
    history = _history("zk", unique("exclusion"), workers=8, rounds=10)
    assert len({pid for _, _, pid in history}) == 8
    assert _overlaps(history) == []


# -- FIFO of 5 processes ------------------------------------------------------------


def _queued_worker(name: str, index: int, out: Any) -> None:
    with locks["zk"].lock(name, timeout=60):
        out.put((index, time.monotonic_ns()))
        time.sleep(0.01)
    _done()


def test_five_processes_are_served_in_arrival_order(unique) -> None:
    require_zookeeper()
    name = unique("fifo")
    _fork_ready()
    backend = locks["zk"]
    holder = backend.lock(name)
    holder.acquire()
    parent = backend.parent_of(backend.make_key(name))
    kazoo = backend.client.get()
    out = FORK.Queue()
    procs = []
    try:
        for index in range(5):
            # Forked while this process holds: the child must not touch our session.
            proc = FORK.Process(target=_queued_worker, args=(name, index, out))
            proc.start()
            procs.append(proc)
            assert eventually(lambda i=index: len(kazoo.get_children(parent)) == i + 2, 30)
        holder.release()
        served = sorted((out.get(timeout=30) for _ in procs), key=lambda item: item[1])
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    assert [index for index, _ in served] == [0, 1, 2, 3, 4]
    assert [proc.exitcode for proc in procs] == [0] * 5


# -- a SIGKILLed holder ----------------------------------------------------------------


def _hold_forever(name: str, ready: Any) -> None:
    handle = locks["zk"].lock(name)
    assert handle.acquire(timeout=10)
    ready.set()
    time.sleep(600)


def test_sigkilled_holder_is_freed_within_the_session_timeout(unique) -> None:
    require_zookeeper()
    name = unique("killed")
    _fork_ready()
    ready = FORK.Event()
    proc = FORK.Process(target=_hold_forever, args=(name, ready))
    proc.start()
    try:
        assert ready.wait(30)
        killed = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    finally:
        if proc.is_alive():
            proc.kill()
    handle = locks["zk"].lock(name)
    assert handle.acquire(blocking=False) is False  # the session outlives the process
    assert handle.acquire(timeout=SESSION_TIMEOUT * 2) is True
    freed_after = time.monotonic() - killed
    record("sigkill", "zk", ttl_s=SESSION_TIMEOUT, freed_s=round(freed_after, 2),
           bound_s=SESSION_TIMEOUT + 2 + 1.5)
    # ZooKeeper expires sessions in tickTime buckets (2 s): up to one tick past the
    # timeout; then a quorum write deletes the node and the watch wakes us (1.5 s of
    # slack for a loaded 2-core machine; measured 6.0-6.8 s).
    assert freed_after < SESSION_TIMEOUT + 2 + 1.5, freed_after
    handle.release()


# -- a SIGSTOPped holder past the session timeout ------------------------------------


def _stopped_holder(name: str, ready: Any, resumed: Any, out: Any) -> None:
    handle = locks["zk"].lock(name)
    assert handle.acquire(timeout=10)
    out.put(handle.fencing_token)
    ready.set()
    assert resumed.wait(60)
    report: dict[str, Any] = {}
    # Release at once, before kazoo has noticed the expiry: it must not delete anything
    # but its own node, which is gone.
    for _ in range(20):
        try:
            handle.release()
            report["release"] = "returned"
        except LockLost:
            report["release"] = "LockLost"
        except BackendUnavailable:  # the connection is being re-established: again
            time.sleep(0.2)
            continue
        break
    report["lost"] = handle.lost
    out.put(report)
    _done()


def test_sigstopped_holder_comes_back_lost(unique) -> None:
    require_zookeeper()
    name = unique("stopped")
    _fork_ready()
    ready, resumed, out = FORK.Event(), FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_stopped_holder, args=(name, ready, resumed, out))
    proc.start()
    backend = locks["zk"]
    try:
        assert ready.wait(30)
        old_token = out.get(timeout=10)
        os.kill(proc.pid, signal.SIGSTOP)
        newcomer = backend.lock(name)
        assert newcomer.acquire(timeout=SESSION_TIMEOUT * 3) is True  # the session expired
        os.kill(proc.pid, signal.SIGCONT)
        resumed.set()
        report = out.get(timeout=60)
        proc.join(10)
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    record("sigstop", "zk", lost=report.get("lost"), release=report.get("release"),
           repeated_tokens=int(not newcomer.fencing_token > old_token))
    assert report == {"release": "LockLost", "lost": True}
    assert proc.exitcode == 0
    parent = backend.parent_of(backend.make_key(name))
    children = backend.client.get().get_children(parent)
    assert children == [hold_of(newcomer).acquisition.node]  # type: ignore[union-attr]
    assert newcomer.held and newcomer.fencing_token > old_token
    newcomer.extend()  # still there
    newcomer.release()


# -- a private ensemble whose servers the tests kill -------------------------------------


def _servers() -> Any:
    path = Path(__file__).resolve().parent.parent / "scripts" / "servers.py"
    spec = importlib.util.spec_from_file_location("distlock_servers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Ensemble:
    def __init__(self, servers: Any, entries: list[dict]) -> None:
        self.servers = servers
        self.entries = entries
        self.hosts = ",".join(f"127.0.0.1:{e['port']}" for e in entries)

    def mode(self, entry: dict) -> str:
        reply = self.servers.ask(entry["port"], b"srvr").decode(errors="replace")
        return next((ln.split(":", 1)[1].strip() for ln in reply.splitlines()
                     if ln.startswith("Mode:")), "down")

    def kill(self, entry: dict) -> None:
        os.kill(entry["pid"], signal.SIGKILL)
        assert eventually(lambda: not self.servers.alive(entry["pid"]), 10)

    def backend(self, alias: str = "private", **options: Any) -> ZooKeeperBackend:
        return ZooKeeperBackend(alias, {
            "BACKEND": "django_distlock.backends.zookeeper.ZooKeeperBackend",
            "LOCATION": self.hosts,
            "OPTIONS": {"SESSION_TIMEOUT": 6, "CONNECT_TIMEOUT": 3, **options},
        })


@pytest.fixture
def ensemble() -> Iterator[Ensemble]:
    require_zookeeper()
    servers = _servers()
    work = Path(tempfile.mkdtemp(prefix="distlock-zk-"))
    # Reap empty containers every 200 ms instead of every minute (read by the JVM).
    saved = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = "-Dznode.container.checkIntervalMs=200"
    try:
        entries = servers.launch_zookeeper(work, servers.free_ports(9))
    finally:
        if saved is None:
            os.environ.pop("JAVA_TOOL_OPTIONS")
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = saved
    try:
        servers.wait_zookeeper(entries)
        yield Ensemble(servers, entries)
    finally:
        servers.stop_entries(entries)
        shutil.rmtree(work, ignore_errors=True)


def _first_server_backend(ensemble: Ensemble) -> ZooKeeperBackend:
    """A backend whose client connects to the first server of the list."""
    return ensemble.backend(CLIENT_OPTIONS={"randomize_hosts": False})


def _survives(ensemble: Ensemble, victim: dict, backend: ZooKeeperBackend,
              label: str = "") -> None:
    """Hold a lock with a waiter queued, kill ``victim``: the session survives, the
    holder keeps the lock (unsure meanwhile), no node is duplicated, nobody else gets
    it, and the waiter is served after the release."""
    name = "survive"
    holder = backend.lock(name)
    assert holder.acquire()
    unsure_seen = []
    got = []
    waiter = threading.Thread(target=lambda: got.append(backend.lock(name, timeout=30).acquire()))
    waiter.start()
    parent = backend.parent_of(backend.make_key(name))
    kazoo = backend.client.get()
    assert eventually(lambda: len(kazoo.get_children(parent)) == 2)
    session = kazoo.client_id[0]
    watch = threading.Thread(target=lambda: unsure_seen.append(
        eventually(lambda: hold_of(holder).unsure, 10)))
    watch.start()
    ensemble.kill(victim)
    other = ensemble.backend("other")  # another session, on any server still up
    second = other.lock(name).acquire(timeout=3)
    record("server-killed", f"zk ({label})", overlaps=int(second))
    assert second is False  # never two holders
    watch.join(15)
    assert eventually(lambda: not hold_of(holder).unsure, 15)
    assert holder.held and not holder.lost
    assert kazoo.client_id[0] == session
    assert len(kazoo.get_children(parent)) == 2  # no duplicate contender
    holder.release()
    waiter.join(30)
    assert got == [True]
    other.close()
    backend.close()
    return None


def test_the_connected_server_killed(ensemble) -> None:
    backend = _first_server_backend(ensemble)
    _survives(ensemble, ensemble.entries[0], backend, "the connected server")


def test_the_leader_killed(ensemble) -> None:
    [leader] = [e for e in ensemble.entries if ensemble.mode(e) == "leader"]
    _survives(ensemble, leader, ensemble.backend(), "the leader")


def test_two_of_three_down_is_a_clear_error_in_time(ensemble) -> None:
    backend = ensemble.backend()
    holder = backend.lock("held")
    assert holder.acquire()
    for entry in ensemble.entries[:2]:
        ensemble.kill(entry)
    assert eventually(lambda: hold_of(holder).unsure, 10)  # it cannot know: stop writing
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="ZooKeeper") as info:
        backend.lock("other").acquire(timeout=1)
    record("server-killed", "zk (2 of 3)", worst_call_s=round(time.monotonic() - started, 2),
           bound_s=3 + 1.5)
    assert time.monotonic() - started < 3 + 1.5  # CONNECT_TIMEOUT and slack
    assert info.value.__cause__ is not None
    fresh = ensemble.backend()  # a new client cannot even open a session
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="did not answer in time"):
        fresh.health()
    assert time.monotonic() - started < 3 + 1.5
    backend.close()
    fresh.close()


def test_empty_lock_parents_are_reaped(ensemble) -> None:
    backend = ensemble.backend()
    with backend.lock("reaped") as first:
        pass
    parent = backend.parent_of(backend.make_key("reaped"))
    kazoo = backend.client.get()
    assert eventually(lambda: kazoo.exists(parent) is None, 10)  # a container, reaped
    with backend.lock("reaped") as second:  # the cached path finds it gone: re-created
        assert kazoo.exists(parent) is not None
    assert second.fencing_token > first.fencing_token  # type: ignore[operator]
    backend.close()


def test_a_waiter_cut_off_just_after_its_listing_keeps_its_one_node(
    ensemble: Ensemble, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops right after a waiter's listing came back (a follower that
    lost its leader drops its clients: CI saw it when the leader was killed). While
    disconnected, kazoo reports no session id, and the attempt took that for "another
    session": it forgot its node (alive, in the same session) and queued a second one
    behind it, which then waits for a node no handle will delete. Now it waits for the
    reconnection and lists again: one node, still queued, served after the release.
    The fault is real: every server of a private ensemble paused for a second and the
    client's socket shut; only its moment is chosen, by wrapping the waiter's listing."""
    import socket

    from kazoo.client import KazooClient

    from django_distlock.backends.zookeeper.acquisition import ZooKeeperAcquisition

    backend = ensemble.backend()
    name = "cut"
    holder = backend.lock(name)
    assert holder.acquire()
    kazoo = backend.client.get()
    # The test pokes and lists through a client of its own: a call of the backend's
    # client that is in flight at the cut fails with ConnectionLoss (touched()'s did on
    # CI). This one's connection outlives the servers' 1 s pause (kazoo's 10 s session:
    # dropped when a ping goes unanswered for about 3 s).
    observer = KazooClient(hosts=ensemble.hosts)
    observer.start(timeout=10)
    parent = backend.parent_of(backend.make_key(name))
    real, cut = ZooKeeperAcquisition._children, []
    noticed: list[bool] = []  # whether the cut was seen: no session id

    def resume() -> None:
        time.sleep(1.0)
        for entry in ensemble.entries:
            os.kill(entry["pid"], signal.SIGCONT)

    def listed_then_cut(self: Any, sent: Any) -> list[str]:
        children = real(self, sent)
        if self.node is not None and not cut and len(children) == 2:
            cut.append(True)  # once: an attempt of the queued waiter
            for entry in ensemble.entries:
                os.kill(entry["pid"], signal.SIGSTOP)
            threading.Thread(target=resume, daemon=True).start()
            kazoo._connection._socket.shutdown(socket.SHUT_RDWR)
            noticed.append(eventually(lambda: kazoo.client_id is None, 0.9))
        return children

    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(backend.lock(name, timeout=20).acquire()))
    try:
        waiter.start()
        assert eventually(lambda: len(observer.get_children(parent)) == 2)
        monkeypatch.setattr(ZooKeeperAcquisition, "_children", listed_then_cut)
        first = min(observer.get_children(parent), key=lambda child: child[-10:])

        def touched() -> bool:  # until the waiter's watch is set and fires
            if not cut:
                observer.set(f"{parent}/{first}", b"touched")
                time.sleep(0.1)
            return bool(cut)

        assert eventually(touched, 10)
        assert eventually(lambda: noticed, 10) and noticed == [True]
        assert eventually(lambda: kazoo.client_id is not None, 10)  # reconnected
        assert eventually(lambda: len(observer.get_children(parent)) >= 2)
        time.sleep(0.5)
        assert len(observer.get_children(parent)) == 2  # the holder's and the waiter's one
        holder.release()
        waiter.join(25)
        assert got == [True]
    finally:
        for entry in ensemble.entries:
            os.kill(entry["pid"], signal.SIGCONT)
        waiter.join(25)
        observer.stop()
        observer.close()
        backend.close()
