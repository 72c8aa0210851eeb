"""Servers partitioned from one client, and a slow, lossy network (issue 22).

Client A is a process in a network namespace of the test's own (:mod:`tests.netns`):
it reaches the servers only through forwarders (:mod:`tests.forwarder`) on the root
side of its veth pair, and a partition is iptables ``DROP`` rules in its namespace
(packets vanish: no reset). B is this process, talking to the servers directly.

The scenario, on each backend: A holds a name with a short TTL (or session); A is
partitioned from the lock's servers (not from the fenced storage); B waits for the
name. Pass criteria: B is granted only after A's lease could have ended, A's
extend and release during the partition raise a library exception within their
documented bound, A's late fenced write is refused, A's release after the heal
does not free B's lock, and the recorded history has no overlap of valid holds and
no repeated token. The delay/loss variant runs a few contending processes through
forwarders that delay every chunk and stall some (see the forwarder's docstring).

Not here: Redis Cluster. Its nodes announce their own addresses (127.0.0.1 of the
root namespace) in ``CLUSTER SLOTS`` and ``MOVED`` replies, which a client in the
namespace cannot reach; routing them needs redis-py's ``address_remap`` callable,
which ``LOCATION``/``OPTIONS`` cannot carry, or a forwarder that rewrites the
cluster protocol. The cluster's failures are covered by test_redis_cluster_nodes.py.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_distlock import locks
from django_distlock.backends.cache.memcached import DEFAULT_TIMEOUT
from django_distlock.backends.database.sessions import WATCHDOG_GRACE
from django_distlock.backends.redis.acquisition import READ_GRACE
from django_distlock.testing.history import HistoryRecorder
from tests.testapp.models import FencedItem

from .conftest import LIBRARY_DB, require_pg
from .figures import record
from .forwarder import Forwarder
from .netns import Namespace, require_netns
from .partition_kit import (
    REDIS_CONNECT,
    SLACK,
    TTL,
    ZK_SESSION,
    Calls,
    Child,
    Routes,
    checked,
    hostport,
    require,
    wait_for,
)
from .test_zookeeper_faults import _servers as zk_servers

pytestmark = [pytest.mark.second_env, LIBRARY_DB]  # second env: balances the lanes
#: What a memcached call may take (no ``timeout`` in the cache's OPTIONS: the driver's).
MEMCACHED_TIMEOUT = DEFAULT_TIMEOUT


@pytest.fixture(scope="module")
def ns() -> Iterator[Namespace]:
    """The module's namespace (deleted at the end, whatever happened)."""
    require_netns()
    made = Namespace()
    yield made
    made.close()


@pytest.fixture
def routes(ns: Namespace) -> Iterator[Routes]:
    require_pg()  # the fenced storage
    made = Routes(ns.root_ip)
    yield made
    ns.heal()
    made.close()


# -- a lease holder partitioned from its servers --------------------------------------


@dataclass(frozen=True)
class Case:
    """A backend's partition: ``count`` of the forwarders of ``cut`` (None: all)."""

    alias: str
    cut: str
    grace: float  #: what a call may take past the lease's local end (the backend's docs)
    #: what a call that must open a new connection may take (the client's own timeouts)
    connect: float = 0.0
    count: int | None = None
    auto_renew: bool = False
    label: str = ""


CASES = [
    Case("redis", "redis", READ_GRACE, REDIS_CONNECT),
    Case("redis", "redis", READ_GRACE, REDIS_CONNECT, auto_renew=True, label="redis/auto_renew"),
    Case("redlock", "redlock", READ_GRACE, count=3, label="redlock/3-of-5"),
    Case("redlock", "redlock", READ_GRACE, count=2, label="redlock/2-of-5"),
    Case("pg-lease", "pg", WATCHDOG_GRACE),
    Case("mysql-lease", "mysql", WATCHDOG_GRACE),
    Case("cache-memcached", "memcached", 0.0, MEMCACHED_TIMEOUT),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label or c.alias)
def test_a_partitioned_holder_loses_its_lease_and_nothing_else(
    case: Case, ns: Namespace, routes: Routes, tmp_path: Path, unique: Any
) -> None:
    require(case.alias)
    name, history = unique("partition"), tmp_path / "history.jsonl"
    rec = HistoryRecorder(history)
    fenced = locks[case.alias].supports_fencing
    pk = FencedItem.objects.using("pg").create(label="init").pk
    a, calls, stale = Child(ns, routes.env(), history), Calls(case.grace, case.connect), 0
    try:
        got = a("acquire", alias=case.alias, name=name, ttl=TTL, auto_renew=case.auto_renew)
        assert "error" not in got, got
        if fenced:
            assert a("write", pk=pk, label="A")["accepted"]
        if case.auto_renew:
            time.sleep(TTL)  # renewed at least once: the lease now ends later than its TTL
            assert not a("status")["lost"]
        until = a("status")["valid_until"]
        ns.partition(routes.ports(case.cut, case.count))
        cut_at = time.monotonic()
        b = routes.b(case.alias, name, rec, timeout=TTL * 2 + 8)
        extended = calls.check(a("extend", wait=TTL + 10), until)
        kept = "error" not in extended  # Redlock with a quorum still reachable
        status = a("status") if kept else wait_for(a, "lost", until + case.grace + 5)
        if not kept:
            assert "lost" in status["seen"], status
            assert status["seen"]["lost"] <= status["valid_until"] + case.grace + SLACK
            time.sleep(max(0.0, status["valid_until"] + 0.05 - time.monotonic()))
            assert b.granted_at is None or b.granted_at >= status["valid_until"]
            b.join()
            assert b.error is None and b.granted_at is not None, b.error
            if fenced:  # B writes; A's late write is refused by the storage
                b.write(pk)
                late = a("write", pk=pk, label="A-late")
                assert "error" not in late, late
                stale += late["accepted"]
        a("end")
        calls.check(a("release", wait=TTL + 10), status["valid_until"])
        ns.heal()
        if kept:  # A kept its lease and released it: now B
            b.join()
            assert b.error is None and b.granted_at is not None, b.error
        else:  # A's late release cannot touch B's lock
            again = a("release")
            assert "error" not in again or again["library"], again
            b.do(b.handle.extend)
            assert locks[case.alias].is_locked(name)
        b.release()
    finally:
        a.close()
    report = checked(history)
    assert stale == 0
    record("partition", case.label or case.alias, processes=2, acquisitions=report.holds,
           overlaps=len(report.overlaps), repeated_tokens=len(report.repeated_tokens),
           stale_writes_accepted=stale,
           lost_notice_s=None if kept else round(status["seen"]["lost"] - cut_at, 3),
           worst_call_s=round(calls.worst, 3), bound_s=round(calls.bound, 3))


# -- ZooKeeper: the session is the lease ------------------------------------------------


def zk_leader() -> str:
    """``host:port`` of the ensemble's leader (four-letter word ``srvr``)."""
    servers = zk_servers()
    for host in settings.ZK_HOSTS.split(","):
        reply = servers.ask(hostport(host)[1], b"srvr").decode(errors="replace")
        if "Mode: leader" in reply:
            return str(host)
    raise AssertionError("no ZooKeeper leader found")


def test_zookeeper_client_partitioned_from_every_node(
    ns: Namespace, routes: Routes, tmp_path: Path, unique: Any
) -> None:
    """A is unsure within the session timeout; B is granted once the session expired on
    the servers; A learns `lost` when it can reach them again."""
    require("zk")
    name, history = unique("partition"), tmp_path / "history.jsonl"
    rec = HistoryRecorder(history)
    pk = FencedItem.objects.using("pg").create(label="init").pk
    a, calls, stale = Child(ns, routes.env(), history), Calls(0.0, ZK_SESSION), 0
    try:
        assert "error" not in a("acquire", alias="zk", name=name, ttl=TTL)
        assert a("write", pk=pk, label="A")["accepted"]
        ns.partition(routes.ports("zk"))
        cut_at = time.monotonic()
        b = routes.b("zk", name, rec, timeout=ZK_SESSION * 3 + 5)
        calls.check(a("extend"), None)
        status = wait_for(a, "unsure", cut_at + ZK_SESSION + SLACK)
        unsure_at = status["seen"]["unsure"]
        assert unsure_at <= cut_at + ZK_SESSION, status
        b.join()
        assert b.error is None and b.granted_at is not None, b.error
        b.write(pk)
        late = a("write", pk=pk, label="A-late")
        stale += late["accepted"]
        a("end")
        calls.check(a("release"), None)
        ns.heal()
        healed = time.monotonic()
        status = wait_for(a, "lost", healed + ZK_SESSION * 2)
        assert "lost" in status["seen"], status
        again = a("release")
        assert "error" not in again or again["library"], again
        b.do(b.handle.extend)
        b.release()
    finally:
        a.close()
    report = checked(history)
    assert stale == 0
    record("partition", "zk/all-nodes", processes=2, acquisitions=report.holds,
           overlaps=len(report.overlaps), repeated_tokens=len(report.repeated_tokens),
           stale_writes_accepted=stale, lost_notice_s=round(unsure_at - cut_at, 3),
           worst_call_s=round(calls.worst, 3), bound_s=round(calls.bound, 3))


def test_zookeeper_client_partitioned_from_the_leader_moves_to_another_node(
    ns: Namespace, routes: Routes, tmp_path: Path, unique: Any
) -> None:
    """The session (and the lock) survive on another node: B is not granted meanwhile."""
    require("zk")
    name, history = unique("partition"), tmp_path / "history.jsonl"
    rec = HistoryRecorder(history)
    a, calls = Child(ns, routes.env(zk_first=zk_leader()), history), Calls(0.0, ZK_SESSION)
    try:
        assert "error" not in a("acquire", alias="zk", name=name, ttl=TTL)
        live = [[c for c in f.conns if not c.closed.is_set()] for f in routes.fwd["zk"]]
        assert live[0] and not any(live[1:]), live  # A's session is on the leader
        ns.partition(routes.ports("zk", 1))
        cut_at = time.monotonic()
        b = routes.b("zk", name, rec, timeout=ZK_SESSION + 2)
        calls.check(a("extend"), None)

        def moved() -> bool:  # A connected through another node's forwarder
            return any(not c.closed.is_set() for f in routes.fwd["zk"][1:] for c in f.conns)

        while not moved() and time.monotonic() < cut_at + ZK_SESSION + SLACK:
            time.sleep(0.01)
        moved_at = time.monotonic()
        assert moved(), "A did not move to another node within the session timeout"
        # (A was ``unsure`` in between, for as short as the reconnection took.)
        status = a("status")
        while status["unsure"] and time.monotonic() < moved_at + ZK_SESSION:
            time.sleep(0.05)
            status = a("status")
        assert not status["unsure"] and not status["lost"], status  # the session survived
        b.join()
        assert b.error is None and b.granted_at is None  # A's session kept the lock
        a("end")
        assert "error" not in calls.check(a("release"), None)
    finally:
        a.close()
    report = checked(history)
    record("partition", "zk/leader", processes=2, acquisitions=report.holds,
           overlaps=len(report.overlaps), repeated_tokens=len(report.repeated_tokens),
           stale_writes_accepted=0, lost_notice_s=None, moved_s=round(moved_at - cut_at, 3),
           worst_call_s=round(calls.worst, 3), bound_s=round(calls.bound, 3))


# -- transaction mode: the lock is the holder's own open transaction -----------------

#: The partitioned client's libpq ``tcp_user_timeout`` on its transaction-mode database
#: (tests/partitioned.py): its calls give up after it.
TX_CLIENT_TIMEOUT = 2.0


#: How long the server takes to see a partitioned holder's session end (the forwarder's
#: stand-in for the server's TCP keepalives).
PEER_TIMEOUT = 2 * TX_CLIENT_TIMEOUT


@pytest.mark.parametrize(("alias", "grace", "connect"), [
    ("pg-tx", 0.0, TX_CLIENT_TIMEOUT), ("pg-session", WATCHDOG_GRACE, 0.0),
    ("mysql-session", WATCHDOG_GRACE, 0.0),
])
def test_a_database_holder_without_a_ttl_partitioned(
    ns: Namespace, routes: Routes, tmp_path: Path, unique: Any, alias: str, grace: float,
    connect: float,
) -> None:
    """No TTL: the server frees the lock (transaction mode: the row lock; session mode:
    PostgreSQL's advisory lock, MariaDB's named lock) when it drops A's session (its TCP
    keepalives, here 4 s). A's extend gives up first: transaction mode after its own
    libpq timeouts (2 s), session mode at its deadline plus the library's watchdog grace
    (its check that the session still holds); so A knows it lost the lock before B is
    granted, and A's stale token is refused by the storage (the history checker)."""
    require(alias)
    name, history = unique("partition"), tmp_path / "history.jsonl"
    rec = HistoryRecorder(history)
    server = "mysql" if alias.startswith("mysql") else "pg"
    routes.peer_timeouts[server] = PEER_TIMEOUT
    a, calls = Child(ns, routes.env(), history), Calls(grace, connect)
    try:
        assert "error" not in a("acquire", alias=alias, name=name, ttl=TTL)
        ns.partition(routes.ports(server))
        cut_at = time.monotonic()
        b = routes.b(alias, name, rec, timeout=2 * PEER_TIMEOUT + 5)
        extended = calls.check(a("extend"), None)
        assert "error" in extended, extended
        status = a("status")
        assert status["lost"], status  # the failed extend told A
        lost_at = status["seen"].get("lost", status["now"])
        b.join()
        assert b.error is None and b.granted_at is not None, b.error
        assert b.granted_at >= lost_at
        a("end")
        calls.check(a("release"), None)
        ns.heal()
        again = a("release")
        assert "error" not in again or again["library"], again
        assert locks[alias].is_locked(name)
        b.release()
    finally:
        a.close()
        connections.close_all()
    report = checked(history)
    record("partition", alias, processes=2, acquisitions=report.holds,
           overlaps=len(report.overlaps), repeated_tokens=len(report.repeated_tokens),
           stale_writes_accepted=0, lost_notice_s=round(lost_at - cut_at, 3),
           worst_call_s=round(calls.worst, 3), bound_s=round(calls.bound, 3))


# -- a slow, lossy network ------------------------------------------------------------------

SLOW_PROCESSES, SLOW_RUN, SLOW_TTL, SLOW_TIMEOUT = 3, 2.0, 2.0, 3.0
#: Each chunk held 50 ms each way (100 ms more a round trip); one in 20 stalled for a
#: retransmission's 0.2-0.6 s.
SLOW = {"mode": "loss", "delay": 0.05, "loss": 0.05, "stall": (0.2, 0.6)}


@pytest.mark.parametrize(("alias", "kind", "grace"), [
    ("redis", "redis", READ_GRACE), ("pg-lease", "pg", WATCHDOG_GRACE),
    ("zk", "zk", ZK_SESSION),
], ids=["redis", "pg-lease", "zk"])
def test_contention_over_a_slow_lossy_network(
    alias: str, kind: str, grace: float, tmp_path: Path, unique: Any
) -> None:
    """A few processes contend through forwarders that delay every chunk and stall some:
    no overlap, no repeated token, every error a library exception, every call within
    its bound (an acquire: its timeout + the grace; a release: the lease + the grace)."""
    require(alias)
    routes = Routes("127.0.0.1")
    name, history = unique("slow"), tmp_path / "history.jsonl"
    children: list[Child] = []
    try:
        env = routes.env()
        for made in routes.fwd[kind]:
            made.set(**SLOW)  # type: ignore[arg-type]
        children = [Child(None, env, history) for _ in range(SLOW_PROCESSES)]
        for child in children:  # all at once: the replies are read after
            assert child.proc.stdin is not None
            child.proc.stdin.write(json.dumps({
                "op": "rounds", "alias": alias, "name": name, "seconds": SLOW_RUN,
                "ttl": SLOW_TTL, "timeout": SLOW_TIMEOUT, "hold": 0.05}) + "\n")
            child.proc.stdin.flush()
        results = [child._reply(SLOW_RUN + SLOW_TIMEOUT + grace + 30) for child in children]
    finally:
        for child in children:
            child.close()
        routes.close()
    assert all("error" not in r for r in results), results
    assert not [r["raw"] for r in results if r["raw"]], results  # library exceptions only
    acquire = max(r["acquire"] for r in results)
    release = max(r["release"] for r in results)
    assert acquire <= SLOW_TIMEOUT + grace + SLACK, results
    assert release <= SLOW_TTL + grace + SLACK, results
    assert sum(r["held"] for r in results) >= SLOW_PROCESSES, results
    report = checked(history)
    record("network-delay", alias, processes=SLOW_PROCESSES, acquisitions=report.holds,
           overlaps=len(report.overlaps), repeated_tokens=len(report.repeated_tokens),
           stale_writes_accepted=0, errors=sum(len(r["errors"]) for r in results),
           worst_call_s=round(max(acquire, release), 3),
           bound_s=round(SLOW_TIMEOUT + grace, 3))


def test_the_forwarder_delays_holds_and_cuts() -> None:
    """The forwarder itself (no namespace needed): its modes do what they say."""
    echo = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = echo.accept()
            while data := conn.recv(1024):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    fwd = Forwarder(echo.getsockname()[:2])
    try:
        client = socket.create_connection((fwd.host, fwd.port), timeout=5)

        def round_trip() -> float:
            began = time.monotonic()
            client.sendall(b"x")
            assert client.recv(16) == b"x"
            return time.monotonic() - began

        assert round_trip() < 0.1
        fwd.set("delay", delay=0.1)
        assert 0.2 <= round_trip() < 0.5  # 0.1 s each way
        fwd.set("blackhole")
        client.sendall(b"x")
        client.settimeout(0.3)
        with pytest.raises(TimeoutError):
            client.recv(16)  # held, not lost: delivered once the mode changes
        fwd.set("pass")
        client.settimeout(5)
        assert client.recv(16) == b"x"
        fwd.set("cut")
        assert client.recv(16) == b""  # closed
    finally:
        fwd.close()
        echo.close()
