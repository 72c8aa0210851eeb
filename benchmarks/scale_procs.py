"""What the ``scale.throughput`` and ``scale.mixed`` suites share: a pool of worker
processes started once per suite, cells run on a barrier, and the server's own
accounting around a cell.

Starting 64 ``spawn`` processes (each importing Django, psycopg, redis-py and
kazoo) costs tens of CPU seconds on a 2-core machine, so a suite starts its
workers once and sends every cell (a case at a process count) to the first N of
them. A cell's job is a module-level function ``job(args, ready) -> result``: it
builds its clients, calls ``ready()`` (which reports to the parent and waits on
the cell's barrier, so all N start together once the parent has read the
servers' counters), loops until its deadline, calls ``ready()`` again (the parent
reads the servers once every loop is over), then closes its clients and returns
what it counted.

Server CPU is read per process from ``/proc/<pid>/stat`` (``utime + stime``; a
PostgreSQL backend that ends between the two reads counts through its parent's
``cutime + cstime``, less what it had spent before the first) of the server
processes, found from the server itself: Redis ``INFO server``
``process_id``, memcached ``stats`` ``pid``, PostgreSQL the parent of its
checkpointer (``pg_stat_activity``) and every child of it, ZooKeeper the
processes whose command line names a ``zoo.cfg`` with one of the client ports.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .lockers import django_setup

#: Longest wait for the workers to be ready (spawn + Django setup + connect) or a cell to end.
STARTUP_TIMEOUT = 180.0
Job = Callable[[Any, Callable[[], None]], Any]


def _worker(index: int, inbox: Any, outbox: Any, barriers: dict[int, Any]) -> None:
    """A pool worker: run the jobs it is sent until it is sent None."""
    django_setup()
    outbox.put((index, "started", None))
    while True:
        message = inbox.get()
        if message is None:
            return
        job, args, n = message
        steps = iter(("ready", "finished"))

        def ready(n: int = n, steps: Any = steps) -> None:
            outbox.put((index, next(steps), None))
            barriers[n].wait(timeout=STARTUP_TIMEOUT)

        try:
            outbox.put((index, "done", job(args, ready)))
        except BaseException:  # reported to the parent, which stops the run
            outbox.put((index, "error", traceback.format_exc()))


class Pool:
    """``size`` spawned workers; cells of ``n`` workers for each ``n`` in ``sizes``."""

    def __init__(self, size: int, sizes: Iterable[int]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.barriers = {n: ctx.Barrier(n + 1) for n in set(sizes)}  # +1: the parent
        self.outbox: Any = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.procs = [
            ctx.Process(target=_worker, args=(i, q, self.outbox, self.barriers), daemon=True)
            for i, q in enumerate(self.inboxes)
        ]
        for proc in self.procs:
            proc.start()
        self._collect(size, "started")

    def _collect(self, n: int, kind: str) -> list[Any]:
        got: dict[int, Any] = {}
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while len(got) < n:
            try:
                index, what, value = self.outbox.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"scale workers: {n - len(got)} not {kind} in time") from None
            if what == "error":
                for barrier in self.barriers.values():
                    barrier.abort()
                raise RuntimeError(f"scale worker {index} failed:\n{value}")
            got[index] = value
        return [got[i] for i in sorted(got)]

    def cell(
        self,
        job: Job,
        args: Sequence[Any],
        start: Callable[[], Any] | None = None,
        stop: Callable[[], Any] | None = None,
    ) -> tuple[Any, Any, float, list[Any]]:
        """Run ``job(args[i], ready)`` on workers 0..len(args)-1, together.

        A job calls ``ready()`` twice: when its clients are built (all start together
        after ``start()``), and when its loop is over, before closing them (they close
        after ``stop()``), so the reads frame the loops and not the connections.

        :param start: a read of the servers' counters just before the workers are let go.
        :param stop: the same once every worker's loop is over.
        :returns: both reads, the seconds between them, and the workers' results.
        :raises RuntimeError: when a worker failed or did not answer in time.
        """
        n, barrier = len(args), self.barriers[len(args)]
        for i in range(n):
            self.inboxes[i].put((job, args[i], n))
        self._collect(n, "ready")
        before = start() if start else None
        barrier.wait(timeout=STARTUP_TIMEOUT)
        began = time.monotonic()
        self._collect(n, "finished")
        elapsed = time.monotonic() - began
        after = stop() if stop else None
        barrier.wait(timeout=STARTUP_TIMEOUT)
        return before, after, elapsed, self._collect(n, "done")

    def close(self) -> None:
        """Stop the workers (they exit on None; a stuck one is terminated)."""
        for inbox in self.inboxes:
            inbox.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()


def run_until(deadline: float, step: Callable[[], None]) -> tuple[int, float]:
    """Call ``step`` until ``time.monotonic()`` passes ``deadline``.

    :returns: calls made and the CPU seconds this process spent doing them.
    """
    count, cpu0 = 0, time.process_time()
    while time.monotonic() < deadline:
        step()
        count += 1
    return count, time.process_time() - cpu0


# --------------------------------------------------------------------------- server CPU

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # fields from 3 (state) on


def cpu_ticks(pids: Iterable[int], reaped_of: Iterable[int] = ()) -> dict[int, int]:
    """``utime + stime`` of each of ``pids`` still there, in clock ticks; for each of
    ``reaped_of``, also its reaped children's ``cutime + cstime`` under the key ``-pid``."""
    ticks, parents = {}, set(reaped_of)
    for pid in pids:
        try:
            fields = _stat(pid)
        except OSError:
            continue
        ticks[pid] = int(fields[11]) + int(fields[12])
        if pid in parents:
            ticks[-pid] = int(fields[13]) + int(fields[14])
    return ticks


def cpu_delta(before: dict[int, int], after: dict[int, int]) -> float:
    """CPU seconds spent between two :func:`cpu_ticks`: a process in both counts its
    difference, a new one all of it; one that ended and was reaped in between had its
    whole life added to its parent's reaped total, less what it had spent before."""
    ticks = sum(t - before.get(pid, 0) for pid, t in after.items())
    ticks -= sum(t for pid, t in before.items() if pid > 0 and pid not in after)
    return ticks / TICK


def children(parent: int) -> list[int]:
    """The pids whose parent is ``parent`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == parent:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def zookeeper_pids(hosts: str) -> list[int]:
    """The processes serving the client ports of ``hosts`` (``h:p,h:p``): those whose
    command line names a ``zoo.cfg`` with one of them as ``clientPort``."""
    ports = {h.rsplit(":", 1)[1] for h in hosts.split(",") if h}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for arg in argv:
            if arg.endswith(b".cfg") and b"zoo" in arg:
                try:
                    cfg = Path(arg.decode()).read_text()
                except OSError:
                    continue
                lines = {line.partition("=")[::2] for line in cfg.splitlines()}
                if any(k.strip() == "clientPort" and v.strip() in ports for k, v in lines):
                    pids.append(int(entry.name))
    return pids


class Meter:
    """The servers behind a case: CPU seconds of their processes, and (PostgreSQL)
    WAL and commit counters; ``read()`` before and after a cell, ``delta()`` between."""

    def __init__(self, pids: Callable[[], list[int]], reaped: bool = False,
                 extra: Callable[[], dict[str, float]] | None = None) -> None:
        self.pids_of, self.reaped, self.extra = pids, reaped, extra

    def read(self) -> dict[str, Any]:
        """The counters now (``cpu``: :func:`cpu_ticks`, None when unreadable)."""
        values = self.read_cpu()
        if self.extra is not None:
            values.update(self.extra())
        return values

    def read_cpu(self) -> dict[str, Any]:
        """:meth:`read` without the ``extra`` counters (the caller adds them later)."""
        cpu: dict[int, int] | None
        try:
            pids = self.pids_of()
            found = [*pids, *(c for p in pids if self.reaped for c in children(p))]
            cpu = cpu_ticks(found, pids if self.reaped else ()) or None
        except Exception:  # no accounting is a blank cell, not a failed run
            cpu = None
        return {"cpu": cpu}

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
        """``after - before`` per counter (``cpu_s``: server CPU seconds, NaN if unread)."""
        cpu_b, cpu_a = before.pop("cpu"), after.pop("cpu")
        got = {k: after[k] - before.get(k, float("nan")) for k in after}
        got["cpu_s"] = cpu_delta(cpu_b, cpu_a) if cpu_b and cpu_a else float("nan")
        return got


def redis_pids(urls: Sequence[str]) -> list[int]:
    """The ``process_id`` of each Redis of ``urls`` (``INFO server``)."""
    import redis

    pids = []
    for url in urls:
        client = redis.Redis.from_url(url)
        try:
            pids.append(int(client.info("server")["process_id"]))
        finally:
            client.close()
    return pids


def memcached_pids(server: tuple[str, int]) -> list[int]:
    """The memcached's ``pid`` (``stats``)."""
    from pymemcache.client.base import Client

    client = Client(server)
    try:
        return [int(client.stats()[b"pid"])]
    finally:
        client.close()


def postgres_pids() -> list[int]:
    """The postmaster: the parent of the server's checkpointer."""
    from . import pg

    with pg.connect() as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
        ).fetchone()
    return [int(_stat(int(row[0]))[1])] if row else []


def postgres_counters() -> dict[str, float]:
    """WAL bytes (``pg_current_wal_lsn``), WAL syncs (``pg_stat_wal``) and this
    database's commits (``pg_stat_database``; a backend reports them at most once a
    second and at exit, so read this after the cell's connections closed)."""
    from . import pg

    time.sleep(0.3)  # the closed sessions' backends report their counters as they exit
    with pg.connect() as conn:
        row = conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0', (SELECT wal_sync FROM pg_stat_wal),"
            " (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())"
        ).fetchone()
    assert row is not None
    return {"wal_bytes": float(row[0]), "wal_syncs": float(row[1]), "commits": float(row[2])}

