"""Suite ``scale.throughput``: pairs per second on distinct names with 4, 16 and 64
client processes, and what each pair costs the server (issue 26, item 2).

Per cell (a case at a process count N), N workers of a pool started once for the
suite (``spawn``, see :mod:`benchmarks.scale_procs`) each build the case's client
on a name of their own (``bench:scale:tp:<case>:<worker>``), take one untimed
acquire+release, then pass a barrier together and loop acquire+release for the
cell's duration (3 s; ``--quick`` 1 s), cut into ``--repeat`` rounds (3; quick 1)
in which the cases of one process count take turns. Process counts:
``--processes-list`` (default ``4,16,64``). The server's CPU seconds
(``/proc/<pid>/stat``) are read just before the barrier and when every worker's
loop is over (before the clients close); on PostgreSQL also the WAL written
(``pg_current_wal_lsn``), the WAL flushes (``pg_stat_wal.wal_sync``) and, after
the clients closed, the commits (``pg_stat_database.xact_commit``). The machine
has 2 cores: with 16 and 64 processes the clients' Python fills the CPUs beside
the server; the ``client CPU`` column says how much of the machine they took.

The full sizes are the defaults; the whole suite takes about 6 minutes (18 cases
x 3 process counts x 3 s, and the clients built anew every round), so measure one
server at a time with ``--cases`` (``'pg.*'``, ``'redis.*,redlock.*'``, ...): about
2 minutes each.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import cache, pg, redlock, scale_procs, zookeeper
from . import redis as redis_cases
from .harness import (
    Case,
    Column,
    Locker,
    LockerFactory,
    NotAcquired,
    Options,
    Row,
    Suite,
    Unavailable,
    add_bar,
    add_case,
    add_suite,
    progress,
    ratio,
)
from .lockers import ACQUIRE_TIMEOUT, TTL, DistLock

NAME = "scale.throughput"


def cell_seconds(options: Options) -> float:
    """How long each cell of the scale suites runs."""
    return 1.0 if options.quick else 3.0


# --------------------------------------------------------------------------- Redis Cluster


def _cluster_url() -> str:
    return os.environ.get("DISTLOCK_REDIS_CLUSTER_URL", "")


def setup() -> None:
    """Nothing to prepare: the ``cluster.*`` rows are left out when no cluster is set
    (``DISTLOCK_REDIS_CLUSTER_URL``), the ``pg.*`` ones need ``benchmarks.pg``'s setup.

    :raises Unavailable: when neither is configured.
    """
    if not _cluster_url() and not os.environ.get("DISTLOCK_PG_PORT"):
        raise Unavailable("neither DISTLOCK_REDIS_CLUSTER_URL nor DISTLOCK_PG_PORT is set")
    if os.environ.get("DISTLOCK_PG_PORT"):
        pg.setup()  # the table ``pg.floor-nosync`` writes to


def describe() -> str:
    """The cluster's size."""
    if not _cluster_url():
        return "no Redis Cluster (DISTLOCK_REDIS_CLUSTER_URL unset)"
    return f"Redis Cluster of {len(_cluster_nodes())} masters"


class AsyncCommitLease(pg.HandLease):
    """The floor's statements on a session with ``synchronous_commit = off``: a grant no
    longer waits for its WAL flush (what durability costs, by difference)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.cursor.execute("SET synchronous_commit = off")


def _cluster_nodes() -> list[str]:
    import redis.cluster

    client = redis.cluster.RedisCluster.from_url(_cluster_url())
    try:
        return [f"redis://{n.host}:{n.port}/0" for n in client.get_primaries()]
    finally:
        client.close()


class ClusterPyLock:
    """redis-py's ``Lock`` on a ``RedisCluster`` client (``client.lock(key, timeout=30)``)."""

    def __init__(self, key: str) -> None:
        import redis.cluster

        self.client = redis.cluster.RedisCluster.from_url(_cluster_url())
        self.key = key
        self.lock: Any = None
        self.lock_of: Callable[[], Any] = functools.partial(
            self.client.lock, key, timeout=TTL, blocking_timeout=ACQUIRE_TIMEOUT
        )

    def acquire(self) -> bool:
        self.lock = self.lock_of()
        return bool(self.lock.acquire())

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.client.close()


class ClusterDistLock(DistLock):
    """django-distlock on the alias ``redis-cluster`` (``OPTIONS["CLUSTER"]``)."""


# --------------------------------------------------------------------------- meters


def _meter(server: str) -> scale_procs.Meter:
    """The accounting of one server kind, from the environment the cases use."""
    env = os.environ.get
    if server == "postgres":
        return scale_procs.Meter(scale_procs.postgres_pids, reaped=True,
                                 extra=scale_procs.postgres_counters)
    if server == "redis":
        return scale_procs.Meter(lambda: scale_procs.redis_pids([env("DISTLOCK_REDIS_URL", "")]))
    if server == "redlock":
        urls = [u for u in env("DISTLOCK_REDLOCK_URLS", "").split(",") if u]
        return scale_procs.Meter(lambda: scale_procs.redis_pids(urls))
    if server == "cluster":
        return scale_procs.Meter(lambda: scale_procs.redis_pids(_cluster_nodes()))
    if server == "zookeeper":
        return scale_procs.Meter(lambda: scale_procs.zookeeper_pids(env("DISTLOCK_ZK_HOSTS", "")))
    return scale_procs.Meter(lambda: scale_procs.memcached_pids(cache._server()))


#: The variable naming each server (a case whose server is unset is left out).
SERVER_ENV = {"postgres": "DISTLOCK_PG_PORT", "redis": "DISTLOCK_REDIS_URL",
              "redlock": "DISTLOCK_REDLOCK_URLS", "cluster": "DISTLOCK_REDIS_CLUSTER_URL",
              "zookeeper": "DISTLOCK_ZK_HOSTS", "memcached": "DISTLOCK_MEMCACHED"}
#: case name -> (server, reference); the factories and labels are registered below.
SERVER: dict[str, tuple[str, str | None]] = {}


def _add(name: str, factory: LockerFactory, what: str, server: str,
         reference: str | None = None) -> None:
    SERVER[name] = (server, reference)
    add_case(NAME, name, factory, what, group=server, reference=reference)


# --------------------------------------------------------------------------- the run


def pairs_job(
    args: tuple[LockerFactory, str, float], ready: Callable[[], None]
) -> tuple[int, float]:
    """A worker's part of a cell: acquire+release on its own name until the deadline.

    :returns: pairs made and the worker's CPU seconds while making them.
    :raises NotAcquired: when a free name was not acquired.
    """
    factory, key, duration = args
    locker: Locker = factory(key)
    try:
        if not locker.acquire():  # connections, the row / lock parent: before the clock
            raise NotAcquired(f"{key}: a free name was not acquired")
        locker.release()
        ready()

        def pair() -> None:
            if not locker.acquire():
                raise NotAcquired(f"{key}: a free name was not acquired")
            locker.release()

        done = scale_procs.run_until(time.monotonic() + duration, pair)
        ready()  # the servers are read before this client closes
        return done
    finally:
        locker.close()


def _no_wait() -> None:
    """``ready`` outside a pool (``--smoke``)."""


def smoke(case: Case) -> None:
    """``--smoke``: a worker's job in this process, 50 ms, no barrier.

    :raises NotAcquired: when a free name was not acquired.
    """
    count, _ = pairs_job((case.factory, f"bench:scale:tp:smoke:{case.name}", 0.05), _no_wait)
    if count < 1:
        raise NotAcquired(f"{case.name}: no pair in 50 ms")


def _round(pool: scale_procs.Pool, case: Case, n: int, seconds: float) -> dict[str, Any]:
    """One round of a cell: the pairs per worker, the workers' CPU, the servers' deltas."""
    meter = _meter(SERVER[case.name][0])
    args = [(case.factory, f"bench:scale:tp:{case.name}:{i}", seconds) for i in range(n)]
    before, after, elapsed, results = pool.cell(pairs_job, args, meter.read, meter.read_cpu)
    if meter.extra is not None:  # commits: a backend reports them at its exit, now
        after.update(meter.extra())
    got = scale_procs.Meter.delta(before, after)
    return {"counts": [c for c, _ in results], "client_s": sum(t for _, t in results),
            "wall": elapsed, **got}


def _values(n: int, seconds: float, rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A cell's row from its rounds (pooled: sums over sums)."""
    pairs = sum(sum(r["counts"]) for r in rounds)
    total = seconds * len(rounds)

    def summed(key: str) -> float:
        return sum(r.get(key, math.nan) for r in rounds)

    per_proc = [sum(c) / total for c in zip(*(r["counts"] for r in rounds), strict=True)]
    rates = [sum(r["counts"]) / seconds for r in rounds]
    values: dict[str, Any] = {
        "processes": n,
        "pairs": pairs,
        "rate": pairs / total,
        "rounds": f"{min(rates):,.0f}..{max(rates):,.0f}",
        "per_proc": f"{min(per_proc):,.0f}..{max(per_proc):,.0f}",
        "client_cpu": 100 * summed("client_s") / summed("wall"),
        "client_per_1k": 1e6 * summed("client_s") / pairs if pairs else math.nan,
        "server_cpu": 100 * summed("cpu_s") / summed("wall"),
        "cpu_per_1k": 1e6 * summed("cpu_s") / pairs if pairs else math.nan,
    }
    for key, column in (("wal_bytes", "wal_per_pair"), ("wal_syncs", "syncs_per_pair"),
                        ("commits", "commits_per_pair")):
        if key in rounds[0] and pairs:
            values[column] = summed(key) / pairs
    return values


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """Every case at every process count; a cell's time is cut into ``--repeat`` rounds,
    the cases of one process count taking turns round by round (the machine's other
    load falls on all of them alike)."""
    sizes, rounds = options.processes_list, options.repeat
    seconds = cell_seconds(options) / rounds
    pool = scale_procs.Pool(max(sizes), sizes)
    rows: list[Row] = []
    try:
        for n in sizes:
            got: dict[str, list[dict[str, Any]]] = {case.name: [] for case in cases}
            cases = [c for c in cases if os.environ.get(SERVER_ENV[SERVER[c.name][0]], "")]
            for i in range(rounds):
                k = i % len(cases)
                for case in [*cases[k:], *cases[:k]]:
                    progress(f"{NAME}: {case.name} with {n} processes, round {i + 1}/{rounds}")
                    got[case.name].append(_round(pool, case, n, seconds))
            for case in cases:
                cell = dataclasses.replace(case, name=f"{case.name}@{n}", group=f"{case.group}@{n}")
                rows.append(Row(cell, _values(n, seconds, got[case.name])))
    finally:
        pool.close()
    _cpu_ratios(rows)
    return rows


def _cpu_ratios(rows: Sequence[Row]) -> None:
    """Server CPU per 1,000 pairs over the floor's and the peer's of the same server and N."""
    anchors = {(r.case.group, r.case.reference): r for r in rows if r.case.reference}
    for row in rows:
        for ref in ("floor", "peer"):
            base = anchors.get((row.case.group, ref))
            if base is not None:
                den = base.values.get("cpu_per_1k", math.nan)
                num = row.values.get("cpu_per_1k", math.nan)
                row.values[f"cpu_x_{ref}"] = num / den if den else math.nan


def _num(fmt: str) -> Callable[[Any], str]:
    return lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _notes(options: Options) -> str:
    return (
        f"{cell_seconds(options):g} s per cell in {options.repeat} round(s) (cases taking "
        f"turns), processes {list(options.processes_list)}, each "
        "on a name of its own; server CPU from `/proc/<pid>/stat` (PostgreSQL: the postmaster "
        "and all its children), % of one core; client CPU: the workers' own, % of one core "
        f"(the machine has {os.cpu_count()} CPUs). WAL B, WAL flushes and commits per pair: "
        "PostgreSQL rows only (`pg_current_wal_lsn`, `pg_stat_wal.wal_sync`, "
        "`pg_stat_database.xact_commit`). `x floor` / `x peer`: pairs/s over the floor's / "
        "the peer's, same server and process count."
    )


add_suite(
    Suite(
        name=NAME,
        title="scale.throughput: distinct names, 4 / 16 / 64 processes",
        run=run,
        columns=(
            Column("processes", "procs"),
            Column("pairs", "pairs", _num("{:,}")),
            Column("rate", "pairs/s", _num("{:,.0f}")),
            Column("rounds", "pairs/s per round"),
            Column("per_proc", "per process pairs/s"),
            Column("client_cpu", "client CPU %", _num("{:.0f}")),
            Column("client_per_1k", "client CPU ms / 1k pairs", _num("{:.0f}")),
            Column("server_cpu", "server CPU %", _num("{:.0f}")),
            Column("cpu_per_1k", "server CPU ms / 1k pairs", _num("{:.0f}")),
            Column("cpu_x_floor", "CPU x floor", ratio),
            Column("cpu_x_peer", "CPU x peer", ratio),
            Column("wal_per_pair", "WAL B / pair", _num("{:.0f}")),
            Column("syncs_per_pair", "WAL flushes / pair", _num("{:.2f}")),
            Column("commits_per_pair", "commits / pair", _num("{:.2f}")),
        ),
        ratio_metric="rate",
        notes=_notes,
        smoke=smoke,
    )
)

_add("pg.floor", pg.HandLease, "hand-written lease statements (psycopg): the floor",
     "postgres", "floor")
_add("pg.floor-django", functools.partial(pg.HandLease, django_binding=True),
     "the same, Django's way: client-side binding, unprepared", "postgres")
_add("pg.floor-nosync", AsyncCommitLease,
     "the floor with `synchronous_commit = off` (no WAL flush wait)", "postgres")
_add("pg.advisory", pg.Advisory, "`pg_advisory_lock` + `unlock`", "postgres", "peer")
_add("pg.lease", pg.lease, "django-distlock, lease mode", "postgres")
_add("pg.tx", pg.transaction_mode, "django-distlock, transaction mode", "postgres")
_add("redis.floor", redis_cases.Floor, "`SET NX PX` + compare-and-delete, raw", "redis", "floor")
_add("redis.redis-py", redis_cases.RedisPyLock, "redis-py `Lock`", "redis", "peer")
_add("redis.python-redis-lock", redis_cases.PythonRedisLock, "python-redis-lock", "redis")
_add("redis.distlock", redis_cases.distlock, "django-distlock `RedisBackend`", "redis")
_add("redlock.pottery", redlock.PotteryRedlock5, "pottery `Redlock`, 5 masters", "redlock",
     "peer")
_add("redlock.distlock", functools.partial(redlock.DistLock, alias="redlock"),
     "django-distlock `RedlockBackend`, 5 masters", "redlock")
_add("cluster.redis-py", ClusterPyLock, "redis-py `Lock` on `RedisCluster`", "cluster", "peer")
_add("cluster.distlock", functools.partial(ClusterDistLock, alias="redis-cluster"),
     "django-distlock on the cluster", "cluster")
_add("zk.kazoo", zookeeper.KazooLock, "kazoo `Lock`, 3-node ensemble", "zookeeper", "peer")
_add("zk.distlock", functools.partial(zookeeper.DistLock, alias="zk"),
     "django-distlock, 3-node ensemble", "zookeeper")
_add("cache.floor", cache.Floor, "pymemcache `add` + `delete`, raw", "memcached", "floor")
_add("cache.distlock", functools.partial(cache.DistLock, alias="cache-memcached"),
     "django-distlock `CacheBackend` on memcached", "memcached")
add_bar(NAME, "pg.floor@16", "pg.lease@16", 1.5)
