"""Suite ``scale.handoff``: the requests a server handles, read from its own accounting
(``MONITOR`` for Redis, ``mntr`` for ZooKeeper, ``stats`` for memcached) or, for
PostgreSQL, counted in the clients (see :mod:`benchmarks.scale_handoff`)."""

from __future__ import annotations

import functools
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from . import cache, redlock


class Monitor:
    """Top-level commands a Redis server runs while open: ``MONITOR`` lines not from ``lua``."""

    END = b"scale-handoff-end"

    def __init__(self, url: str) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.sock = socket.create_connection(self.address, timeout=30)
        self.sock.sendall(b"MONITOR\r\n")
        self.buffer = bytearray()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        seen = 0
        while self.buffer.find(self.END, max(0, seen - len(self.END))) < 0:
            seen = len(self.buffer)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return
            self.buffer += chunk

    def stop(self) -> int:
        """Mark the end, read up to it, close; return the top-level commands seen."""
        with socket.create_connection(self.address, timeout=30) as other:
            other.sendall(b"ECHO " + self.END + b"\r\n")
            other.recv(100)
        self.thread.join(30)
        self.sock.close()
        body = bytes(self.buffer)
        end = body.find(self.END)
        if end < 0:
            raise RuntimeError(f"MONITOR on {self.address} did not show the end mark")
        body = body[:end]
        # every line but the "+OK" MONITOR answers with, the end mark's own and lua's
        return body.count(b"\r\n") - 1 - body.count(b" lua] ")


def _mntr(hosts: str) -> tuple[int, int]:
    """``zk_packets_received`` and ``zk_response_bytes``, summed over ``hosts``."""
    packets = replies = 0
    for host in hosts.split(","):
        name, port = host.rsplit(":", 1)
        with socket.create_connection((name, int(port)), timeout=10) as sock:
            sock.sendall(b"mntr")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        for line in data.decode().splitlines():
            if line.startswith("zk_packets_received"):
                packets += int(line.split()[1])
            elif line.startswith("zk_response_bytes"):
                replies += int(float(line.split()[1]))
    return packets, replies


MEMCACHED_STATS = ("cmd_get", "cmd_set", "cmd_touch", "delete_hits", "delete_misses",
                   "incr_hits", "incr_misses", "decr_hits", "decr_misses")


def _memcached_requests() -> tuple[int, int]:
    from pymemcache.client.base import Client

    client = Client(cache._server())
    try:
        stats = {k.decode() if isinstance(k, bytes) else k: v for k, v in client.stats().items()}
    finally:
        client.close()
    return sum(int(stats[name]) for name in MEMCACHED_STATS), int(stats["bytes_written"])


class ServerCount:
    """A server counter read at the window's start and end (the parent does it)."""

    def __init__(self, counter: str, statements: Any = None) -> None:
        self.counter, self.first, self.statements = counter, (0, 0), statements
        #: Bytes the server sent its clients in the window (ZooKeeper, memcached), or None.
        self.reply_bytes: int | None = None
        self.monitors: list[Monitor] = []

    def start(self) -> None:
        if self.counter == "redis":
            self.monitors = [Monitor(os.environ["DISTLOCK_REDIS_URL"])]
        elif self.counter == "redlock":
            self.monitors = [Monitor(u) for u in redlock._urls()]
        else:
            self.first = self.read()

    def stop(self) -> int:
        if self.monitors:
            return sum(m.stop() for m in self.monitors)
        last = self.read()
        if self.counter in ("zookeeper", "zookeeper1", "memcached"):
            self.reply_bytes = last[1] - self.first[1]
        return last[0] - self.first[0]

    def read(self) -> tuple[int, int]:
        """(requests, bytes sent to clients) so far; bytes 0 where not counted."""
        if self.counter == "zookeeper":
            return _mntr(os.environ["DISTLOCK_ZK_HOSTS"])
        if self.counter == "zookeeper1":  # the standalone server
            return _mntr(os.environ["DISTLOCK_ZK_STANDALONE"])
        if self.counter == "memcached":
            return _memcached_requests()
        return (self.statements.value if self.statements is not None else 0), 0  # postgres


def count_statements(counter: Any) -> None:
    """Count every psycopg ``execute`` of this process in ``counter`` (a shared
    ``multiprocessing.Value``)."""
    import psycopg

    def add() -> None:
        with counter.get_lock():
            counter.value += 1

    def counted(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def execute(*args: Any, **kwargs: Any) -> Any:
            add()
            return method(*args, **kwargs)

        return execute

    def acounted(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def execute(*args: Any, **kwargs: Any) -> Any:
            add()
            return await method(*args, **kwargs)

        return execute

    psycopg.Cursor.execute = counted(psycopg.Cursor.execute)  # type: ignore[method-assign]
    psycopg.AsyncCursor.execute = acounted(psycopg.AsyncCursor.execute)  # type: ignore[method-assign]


def count_listings(counter: Any) -> None:
    """Count every ``get_children`` request kazoo sends from this process in ``counter``
    (a shared ``multiprocessing.Value``): the listings whose replies grow with the queue."""
    from kazoo.client import KazooClient

    real = KazooClient._call

    def call(client: KazooClient, request: Any, result: Any) -> Any:
        if type(request).__name__.startswith("GetChildren"):
            with counter.get_lock():
                counter.value += 1
        return real(client, request, result)

    KazooClient._call = call  # type: ignore[method-assign]  # a waiter process only


def _stat(pid: int | str) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2:].split()  # the fields after "pid (comm) "


def cpu_ns(pids: list[int]) -> int:
    """User + system CPU time (ns) used so far by the processes ``pids`` (``/proc``).

    :param pids: live processes (all their threads are counted).
    :returns: the nanoseconds.
    """
    return sum(int(f[11]) + int(f[12]) for f in map(_stat, pids)) * 1_000_000_000 // os.sysconf(
        "SC_CLK_TCK")


def server_cpu_ns() -> int | None:
    """CPU time (ns) used so far by the local server process ``DISTLOCK_BENCH_SERVER_PID``
    names and its children (a PostgreSQL postmaster's backends; a ZooKeeper JVM's
    threads are in its own figure), from ``/proc``: its own, its reaped children's and
    its live children's user + system time. None when the variable is not set.

    :returns: the nanoseconds, or None.
    """
    raw = os.environ.get("DISTLOCK_BENCH_SERVER_PID", "").strip()
    if not raw:
        return None
    pid, tick = int(raw), os.sysconf("SC_CLK_TCK")
    ticks = sum(int(x) for x in _stat(pid)[11:15])  # utime stime cutime cstime
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            child = _stat(entry)
        except OSError:  # gone meanwhile
            continue
        if int(child[1]) == pid:  # ppid
            ticks += int(child[11]) + int(child[12])
    return ticks * 1_000_000_000 // tick
