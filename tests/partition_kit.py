"""The machinery of tests/test_partitions.py: forwarders per server and the client
environment that points at them (:class:`Routes`), client A in its namespace
(:class:`Child`, running tests/partitioned.py), client B in a thread of this process
(:class:`B`), and the checks of A's calls (:class:`Calls`)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connections

from django_distlock import locks
from django_distlock.handle import hold_of
from django_distlock.testing.history import HistoryRecorder, HistoryReport, check, load
from tests.testapp.models import FencedItem

from .conftest import (
    require_memcached,
    require_mysql,
    require_pg,
    require_redis,
    require_zookeeper,
)
from .forwarder import Forwarder
from .netns import Namespace

ROOT = Path(__file__).resolve().parent.parent
#: Scheduling slack on a loaded 2-core machine, on top of every documented bound.
SLACK = 0.75
TTL = 1.5
ZK_SESSION = 4.0  # the "zk" alias' SESSION_TIMEOUT (and so its CONNECT_TIMEOUT)
#: What opening a new connection to Redis may take (docs/redis.md, "Failures": "opening
#: a new connection is bounded by the socket timeouts only"): A's URLs set 1 s, as a
#: user would for a lease of seconds (redis-py 8's default is 5 s).
REDIS_CONNECT = 1.0
REDIS_QUERY = "socket_connect_timeout=1"


def hostport(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port``."""
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
        made = [Forwarder(hostport(a), host=self.host, peer_timeout=peer)
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
        if "mysql" in settings.DATABASES:
            mysql = connections["mysql"].settings_dict
            [via] = self.add("mysql", [f"{mysql['HOST']}:{mysql['PORT']}"])
            env["DISTLOCK_MYSQL_HOST"], env["DISTLOCK_MYSQL_PORT"] = via.split(":")
            env["DISTLOCK_MYSQL_NAME"] = mysql["NAME"]  # the test database
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
                until = hold_of(self.handle).valid_until
                self.rec.granted(self.op, self.handle.fencing_token, until)
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
    elif alias.startswith("mysql"):
        require_mysql()


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


def checked(history: Path) -> HistoryReport:
    report = check(load(history))
    report.raise_if_bad()  # no overlap of valid holds, no repeated token, no write back
    return report
