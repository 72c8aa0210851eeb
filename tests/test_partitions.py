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
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connections

from django_distlock import locks
from django_distlock.backends.cache.memcached import DEFAULT_TIMEOUT
from django_distlock.backends.database.sessions import WATCHDOG_GRACE
from django_distlock.backends.redis.acquisition import READ_GRACE
from django_distlock.testing.history import HistoryRecorder, check, load
from tests.testapp.models import FencedItem

from .conftest import DATABASES, require_memcached, require_pg, require_redis, require_zookeeper
from .figures import record
from .forwarder import Forwarder
from .netns import Namespace, require_netns
from .test_zookeeper_faults import _servers as zk_servers

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

ROOT = Path(__file__).resolve().parent.parent
#: Scheduling slack on a loaded 2-core machine, on top of every documented bound.
SLACK = 0.75
TTL = 1.5
ZK_SESSION = 4.0
#: What opening a new connection to Redis may take (docs/redis.md, "Failures": "opening
#: a new connection is bounded by the socket timeouts only"): A's URLs set 1 s, as a
#: user would for a lease of seconds (redis-py 8's default is 5 s).
REDIS_CONNECT = 1.0
REDIS_QUERY = "socket_connect_timeout=1"
#: What a memcached call may take (no ``timeout`` in the cache's OPTIONS: the driver's).
MEMCACHED_TIMEOUT = DEFAULT_TIMEOUT  # the "zk" alias' SESSION_TIMEOUT (and so its CONNECT_TIMEOUT)


def _hostport(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass
class Routes:
    """A forwarder per server (and one more to PostgreSQL for the fenced storage), and
    the environment that points a client at them."""

    host: str  #: where the forwarders listen
    fwd: dict[str, list[Forwarder]] = field(default_factory=dict)
    bs: list[B] = field(default_factory=list)

    #: How long a server takes to notice that A vanished (its TCP keepalives; see the
    #: forwarder), per kind of server.
    peer_timeouts: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, addresses: list[str]) -> list[str]:
        peer = self.peer_timeouts.get(kind, 3.0)
        made = [Forwarder(_hostport(a), host=self.host, peer_timeout=peer)
                for a in addresses]
        self.fwd[kind] = made
        return [f.address for f in made]

    def ports(self, kind: str, count: int | None = None) -> list[int]:
        return [f.port for f in self.fwd[kind][:count]]

    def b(self, alias: str, name: str, rec: HistoryRecorder, timeout: float) -> B:
        """Client B (released at the end of the test, whatever happened)."""
        self.bs.append(B(alias, name, rec, timeout))
        return self.bs[-1]

    def close(self) -> None:
        for b in self.bs:
            b.release()
        for made in self.fwd.values():
            for f in made:
                f.close()

    def env(self, zk_first: str | None = None) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("DISTLOCK_FIGURES", None)
        pg = connections["pg"].settings_dict
        [lock_path] = self.add("pg", [f"{pg['HOST']}:{pg['PORT']}"])
        [storage] = self.add("storage", [f"{pg['HOST']}:{pg['PORT']}"])
        env["DISTLOCK_PG_HOST"], env["DISTLOCK_PG_PORT"] = lock_path.split(":")
        env["DISTLOCK_STORAGE_HOST"], env["DISTLOCK_STORAGE_PORT"] = storage.split(":")
        env["DISTLOCK_PG_NAME"] = pg["NAME"]  # the test database
        if settings.REDIS_URL:
            url = urlsplit(settings.REDIS_URL)
            [via] = self.add("redis", [url.netloc])
            env["DISTLOCK_REDIS_URL"] = url._replace(netloc=via, query=REDIS_QUERY).geturl()
        if settings.REDLOCK_URLS:
            urls = [urlsplit(u) for u in settings.REDLOCK_URLS.split(",")]
            vias = self.add("redlock", [u.netloc for u in urls])
            env["DISTLOCK_REDLOCK_URLS"] = ",".join(
                u._replace(netloc=v).geturl()  # Redlock's own 0.1 s socket timeouts
                for u, v in zip(urls, vias, strict=True))
        if settings.MEMCACHED:
            [env["DISTLOCK_MEMCACHED"]] = self.add("memcached", [settings.MEMCACHED])
        if settings.ZK_HOSTS:
            hosts = settings.ZK_HOSTS.split(",")
            if zk_first:
                hosts.sort(key=lambda h: h != zk_first)
            env["DISTLOCK_ZK_HOSTS"] = ",".join(self.add("zk", hosts))
        env.pop("DISTLOCK_REDIS_CLUSTER_URL", None)  # see the module's docstring
        return env


class Child:
    """Client A: ``tests/partitioned.py`` in the namespace (or not: ``ns`` None), one
    command at a time."""

    def __init__(self, ns: Namespace | None, env: dict[str, str], history: Path) -> None:
        argv = [sys.executable, "-m", "tests.partitioned", str(history)]
        pipes = {"cwd": ROOT, "env": env, "stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        self.proc = ns.popen(argv, **pipes) if ns else subprocess.Popen(argv, text=True, **pipes)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert "ready" in self._reply(30)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def _reply(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"client A did not answer within {timeout} s") from None
        assert line, f"client A exited ({self.proc.poll()})"
        reply: dict[str, Any] = json.loads(line)
        return reply

    def __call__(self, op: str, wait: float = 30, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self._reply(wait)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(AssertionError, OSError):
                self("exit", wait=0.01)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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


def library_error(reply: dict[str, Any]) -> bool:
    return bool(reply.get("error")) and bool(reply.get("library"))


class B:
    """Client B, direct: waits for the name in a thread of its own, which then holds it
    (a transaction-mode lock lives in that thread's transaction) and runs :meth:`do`'s
    calls until :meth:`release`; its hold is recorded."""

    def __init__(self, alias: str, name: str, rec: HistoryRecorder, timeout: float) -> None:
        self.handle = locks[alias].lock(name, ttl=30)
        self.rec, self.timeout = rec, timeout
        self.granted_at: float | None = None
        self.error: BaseException | None = None
        self.decided = threading.Event()
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.op = self.rec.invoke(self.handle.name)
        try:
            if self.handle.acquire(timeout=self.timeout):
                self.granted_at = time.monotonic()
                self.rec.granted(self.op, self.handle.fencing_token, self.handle.valid_until)
            else:
                self.rec.failed(self.op)
        except BaseException as exc:
            self.error = exc
            self.rec.failed(self.op, exc)
        self.decided.set()
        while (job := self.jobs.get()) is not None:
            func, out = job
            try:
                out.put((True, func()))
            except BaseException as exc:
                out.put((False, exc))
        connections.close_all()

    def join(self) -> None:
        """Wait until B was granted or gave up."""
        assert self.decided.wait(self.timeout + 10)

    def do(self, func: Any) -> Any:
        """``func()`` in B's thread; what it returned (or raise what it raised)."""
        out: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self.jobs.put((func, out))
        ok, value = out.get(timeout=30)
        if not ok:
            raise value
        return value

    def write(self, pk: int) -> None:
        """A fenced write with B's token: accepted."""
        def write() -> None:
            item = FencedItem.objects.using("pg").get(pk=pk)
            item.label, began = "B", time.monotonic_ns()
            item.fenced_save(self.handle, using="pg")
            self.rec.write(self.handle.name, self.handle.fencing_token, accepted=True,
                           began=began)

        self.do(write)

    def release(self) -> None:
        """Release (if granted) and end the thread; once."""
        if not self.thread.is_alive():
            return
        if self.decided.wait(self.timeout + 10) and self.granted_at is not None:
            self.do(lambda: (self.rec.released(self.op), self.handle.release()))
        self.jobs.put(None)
        self.thread.join(10)


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
    Case("cache-memcached", "memcached", 0.0, MEMCACHED_TIMEOUT),
]


def require(alias: str) -> None:
    require_pg()
    if alias == "redlock":
        require_redis(redlock=True)
    elif alias.startswith("redis"):
        require_redis()
    elif alias.startswith("cache"):
        require_memcached()
    elif alias.startswith("zk"):
        require_zookeeper()


class Calls:
    """A's calls: each within its bound, every error a library exception."""

    def __init__(self, grace: float, connect: float = 0.0) -> None:
        self.grace, self.connect, self.worst, self.bound = grace, connect, 0.0, 0.0

    def check(self, reply: dict[str, Any], valid_until: float | None,
              may_fail: bool = True) -> dict[str, Any]:
        if "error" in reply:
            assert may_fail and reply["library"], f"not a library exception: {reply}"
        end = reply["began"] if valid_until is None else max(reply["began"], valid_until)
        bound = max(end + self.grace - reply["began"], self.connect)
        assert reply["took"] <= bound + SLACK, f"{reply} took longer than its bound {bound:.2f} s"
        self.worst, self.bound = max(self.worst, reply["took"]), max(self.bound, bound)
        return reply


def wait_for(a: Child, what: str, until: float) -> dict[str, Any]:
    """A's status once ``what`` (``lost``/``unsure``) was seen, or at ``until``."""
    while True:
        status = a("status")
        if what in status["seen"] or time.monotonic() > until:
            return status
        time.sleep(0.05)


def checked(history: Path) -> Any:
    report = check(load(history))
    report.raise_if_bad()  # no overlap of valid holds, no repeated token, no write back
    return report


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
        reply = servers.ask(_hostport(host)[1], b"srvr").decode(errors="replace")
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
        status = wait_for(a, "unsure", cut_at + ZK_SESSION + SLACK)
        assert "unsure" in status["seen"], status
        deadline = time.monotonic() + ZK_SESSION
        while status["unsure"] and time.monotonic() < deadline:
            status = a("status")
            time.sleep(0.05)
        assert not status["unsure"] and not status["lost"], status  # reconnected in time
        b.join()
        assert b.error is None and b.granted_at is None  # A's session kept the lock
        a("end")
        assert "error" not in calls.check(a("release"), None)
    finally:
        a.close()
    report = checked(history)
    record("partition", "zk/leader", processes=2, acquisitions=report.holds,
           overlaps=len(report.overlaps), repeated_tokens=len(report.repeated_tokens),
           stale_writes_accepted=0,
           lost_notice_s=round(status["seen"]["unsure"] - cut_at, 3),
           worst_call_s=round(calls.worst, 3), bound_s=round(calls.bound, 3))


# -- transaction mode: the lock is the holder's own open transaction -----------------

#: The partitioned client's libpq ``tcp_user_timeout`` on its transaction-mode database
#: (tests/partitioned.py): its calls give up after it.
TX_CLIENT_TIMEOUT = 2.0


def test_postgres_transaction_mode_holder_partitioned(
    ns: Namespace, routes: Routes, tmp_path: Path, unique: Any
) -> None:
    """No TTL: the server frees the row lock when it drops A's session (its TCP
    keepalives, here 4 s); A's calls give up after its own libpq timeouts (2 s). With
    the client's timeout the shorter, A knows before B is granted."""
    require("pg-tx")
    name, history = unique("partition"), tmp_path / "history.jsonl"
    rec = HistoryRecorder(history)
    routes.peer_timeouts["pg"] = 2 * TX_CLIENT_TIMEOUT
    a, calls = Child(ns, routes.env(), history), Calls(0.0, TX_CLIENT_TIMEOUT)
    try:
        assert "error" not in a("acquire", alias="pg-tx", name=name, ttl=TTL)
        ns.partition(routes.ports("pg"))
        cut_at = time.monotonic()
        b = routes.b("pg-tx", name, rec, timeout=4 * TX_CLIENT_TIMEOUT + 5)
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
        assert locks["pg-tx"].is_locked(name)
        b.release()
    finally:
        a.close()
        connections.close_all()
    report = checked(history)
    record("partition", "pg-tx", processes=2, acquisitions=report.holds,
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
