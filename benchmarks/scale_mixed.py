"""Suite ``scale.mixed``: a web-like load through the decorator (issue 26, item 5).

Per case, ``--processes`` workers (default 8; a pool started once for the suite,
``spawn``) each decorate a function ``work(key)`` with
``@distlock("bench:scale:item:{key}", using=alias, ttl=30, timeout=1,
on_fail="skip")`` and, after a barrier, call it in a loop for the cell's duration
(3 s; ``--quick`` 1 s) with keys drawn from 10,000 names of Zipf popularity
(s = 1.1: the first name gets about 1 call in 6, the last 1 in 150,000). The
body holds the lock 0-2 ms (uniform) and proves mutual exclusion: it reads a
per-name counter in Redis (``HGET``), sleeps the hold, writes it back plus one
(``HSET``), not atomically. Each worker counts its calls that ran, per name;
after the cell the counters must equal the calls: ``overlaps`` is the number of
increments lost (two holders of one name at once), and must be 0.

The peers do the same through a minimal decorator of the same shape around
redis-py's ``Lock``, kazoo's ``Lock`` and ``pg_advisory_lock`` (``x peer``:
calls/s over the peer's on the same server). The counters live in the Redis of
``DISTLOCK_REDIS_URL`` for every case (two round trips inside each hold).
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import scale_procs
from .harness import (
    Case,
    Column,
    Options,
    Row,
    Suite,
    Unavailable,
    add_case,
    add_suite,
    percentile,
    progress,
    us,
)
from .lockers import TTL, django_setup
from .scale_throughput import _no_wait, _num, cell_seconds

NAME = "scale.mixed"
NAMES = 10_000
ZIPF_S = 1.1
HOLD_MS = (0.0, 2.0)
TIMEOUT = 1.0
SKIPPED = "skipped"
COUNTERS = "bench:scale:mixed:counters"


def setup() -> None:
    """Check the counters' Redis; migrate the benchmark database when PostgreSQL is set.

    :raises Unavailable: when no Redis is configured (it holds the counters).
    """
    if not os.environ.get("DISTLOCK_REDIS_URL"):
        raise Unavailable("DISTLOCK_REDIS_URL is not set: the mixed load keeps its counters there")
    if os.environ.get("DISTLOCK_PG_PORT"):
        from . import pg

        pg.setup()
    django_setup()


def describe() -> str:
    """The load's shape."""
    return f"mixed load: {NAMES:,} names, Zipf s={ZIPF_S}, holds {HOLD_MS[0]:g}-{HOLD_MS[1]:g} ms"


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(os.environ["DISTLOCK_REDIS_URL"])


# --------------------------------------------------------------------------- the peers' locks


def _redis_py(key: str) -> Any:
    client = _redis()
    return lambda name: client.lock(name, timeout=TTL, blocking_timeout=TIMEOUT), client.close


def _kazoo(key: str) -> Any:
    from kazoo.recipe.lock import Lock

    from .zookeeper import ROOT, _client

    client = _client("zk")

    class Kazoo:
        def __init__(self, name: str) -> None:
            self.lock = Lock(client, f"{ROOT}/{name.replace('/', '_')}")

        def acquire(self) -> bool:
            return bool(self.lock.acquire(timeout=TIMEOUT))

        def release(self) -> None:
            self.lock.release()

    def close() -> None:
        client.stop()
        client.close()

    return Kazoo, close


def _advisory(key: str) -> Any:
    import psycopg

    from .pg import advisory_key, connect

    conn = connect()
    conn.execute("SELECT set_config('lock_timeout', %s, false)", [f"{int(TIMEOUT * 1000)}ms"])

    class Advisory:
        def __init__(self, name: str) -> None:
            self.params = [advisory_key(name)]

        def acquire(self) -> bool:
            try:
                conn.execute("SELECT pg_advisory_lock(%s)", self.params)
            except psycopg.errors.LockNotAvailable:
                return False
            return True

        def release(self) -> None:
            conn.execute("SELECT pg_advisory_unlock(%s)", self.params)

    return Advisory, conn.close


PEERS: dict[str, Callable[[str], Any]] = {
    "redis-py": _redis_py, "kazoo": _kazoo, "advisory": _advisory
}

#: The variable naming each peer's server.
PEER_ENV = {"redis-py": "DISTLOCK_REDIS_URL", "kazoo": "DISTLOCK_ZK_HOSTS",
            "advisory": "DISTLOCK_PG_PORT"}


def peer_lock(make: Callable[[str], Any], template: str) -> Callable[[Callable[..., Any]], Any]:
    """A minimal decorator of ``@distlock``'s shape around a peer's lock object."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(key: str) -> Any:
            lock = make(template.format(key=key))
            if not lock.acquire():
                return SKIPPED
            try:
                return func(key)
            finally:
                lock.release()

        return wrapper

    return decorate


# --------------------------------------------------------------------------- one client


class MixedClient:
    """One worker's decorated function (a Locker too: ``acquire()`` is one call, for
    ``--smoke``)."""

    def __init__(self, key: str, *, alias: str = "", peer: str = "") -> None:
        django_setup()
        from django_distlock import distlock, locks

        self.locks, self.counters = locks, _redis()
        self._close_peer: Callable[[], None] = lambda: None
        template = "bench:scale:item:{key}"
        if peer:
            make, self._close_peer = PEERS[peer](key)
            decorator = peer_lock(make, template)
        else:
            decorator = distlock(template, using=alias, ttl=TTL, timeout=TIMEOUT,
                                 on_fail="skip", skip_value=SKIPPED)
        self.call = decorator(self.work)
        self.first_key = key

    def work(self, key: str) -> bool:
        """The critical section: a non-atomic read-increment-write of the name's counter."""
        value = self.counters.hget(COUNTERS, key)
        time.sleep(random.uniform(*HOLD_MS) / 1000)
        self.counters.hset(COUNTERS, key, int(value or 0) + 1)
        return True

    def acquire(self) -> bool:
        return self.call(key=self.first_key) is not SKIPPED

    def release(self) -> None:
        return None

    def close(self) -> None:
        from django.db import connections

        self._close_peer()
        self.counters.close()
        self.locks.close_all()
        connections.close_all()


def zipf_keys(seed: int) -> Iterator[str]:
    """Endless keys ``0..NAMES-1``, key i drawn with weight 1 / (i + 1) ** ZIPF_S."""
    rng = random.Random(seed)
    cum = list(itertools.accumulate(1 / (i + 1) ** ZIPF_S for i in range(NAMES)))
    while True:
        yield from map(str, rng.choices(range(NAMES), cum_weights=cum, k=1000))


def mixed_job(args: tuple[Callable[[str], Any], int, float],
              ready: Callable[[], None]) -> dict[str, Any]:
    """A worker's part: call the decorated function on Zipf keys until the deadline."""
    factory, seed, duration = args
    client = factory("0")
    try:
        ran: Counter[str] = Counter()
        if client.call(key="0") is not SKIPPED:
            ran["0"] += 1
        keys, clock, times, skipped = zipf_keys(seed), time.perf_counter_ns, [], 0
        ready()
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            key = next(keys)
            t0 = clock()
            result = client.call(key=key)
            times.append(clock() - t0)
            if result is SKIPPED:
                skipped += 1
            else:
                ran[key] += 1
        ready()
        return {"times": times, "skipped": skipped, "ran": ran}
    finally:
        client.close()


def _counted(calls: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """Run ``calls()`` on fresh counters; return its value and the counters it left."""
    counters = _redis()
    try:
        counters.delete(COUNTERS)
        value = calls()
        stored = {k.decode(): int(v) for k, v in counters.hgetall(COUNTERS).items()}
        counters.delete(COUNTERS)
    finally:
        counters.close()
    return value, stored


def smoke(case: Case) -> None:
    """``--smoke``: a worker's job in this process, 50 ms, no barrier, counters checked.

    :raises RuntimeError: when no call ran or a counter disagrees with the calls.
    """
    result, stored = _counted(lambda: mixed_job((case.factory, 0, 0.05), _no_wait))
    if not result["ran"] or dict(result["ran"]) != stored:
        raise RuntimeError(f"{case.name}: ran {dict(result['ran'])}, counters {stored}")


def _cell(pool: scale_procs.Pool, case: Case, n: int, seconds: float) -> dict[str, Any]:
    args = [(case.factory, i, seconds) for i in range(n)]
    cell, stored = _counted(lambda: pool.cell(mixed_job, args))
    results = cell[3]
    ran: Counter[str] = sum((r["ran"] for r in results), Counter())
    times = sorted(t for r in results for t in r["times"])
    top = ran.most_common(1)[0][1] if ran else 0
    return {
        "processes": n,
        "calls": len(times),
        "rate": len(times) / seconds,
        "p50": percentile(times, 50),
        "p99": percentile(times, 99),
        "skipped": sum(r["skipped"] for r in results),
        "overlaps": sum(ran.values()) - sum(stored.values()),
        "mismatched": sum(1 for k in ran.keys() | stored.keys() if ran[k] != stored.get(k, 0)),
        "names": len(ran),
        "top": 100 * top / max(1, sum(ran.values())),
    }


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """Every case in turn with ``--processes`` workers."""
    from django.conf import settings

    n, seconds = options.processes, cell_seconds(options)
    pool = scale_procs.Pool(n, [n])
    rows = []
    try:
        for case in cases:
            keywords = getattr(case.factory, "keywords", {})
            alias, peer = keywords.get("alias"), keywords.get("peer")
            if (alias and alias not in settings.DISTLOCK) or not os.environ.get(
                PEER_ENV.get(peer or "", "DISTLOCK_REDIS_URL")
            ):
                progress(f"{NAME}: {case.name} skipped, its server is not configured")
                continue
            progress(f"{NAME}: {case.name} with {n} processes")
            rows.append(Row(case, _cell(pool, case, n, seconds)))
    finally:
        pool.close()
    return rows


def _notes(options: Options) -> str:
    return (
        f"{options.processes} processes, {cell_seconds(options):g} s per case, {NAMES:,} names, "
        f"Zipf s={ZIPF_S}, holds {HOLD_MS[0]:g}-{HOLD_MS[1]:g} ms, `timeout={TIMEOUT:g}` with "
        "`on_fail=\"skip\"`; a call's time includes its two counter round trips and the hold. "
        "overlaps: increments lost by the non-atomic counters (must be 0); mismatched names: "
        "names whose counter differs from the calls that ran."
    )


add_suite(
    Suite(
        name=NAME,
        title="scale.mixed: Zipf names, short holds, through the decorator",
        run=run,
        columns=(
            Column("processes", "procs"),
            Column("calls", "calls", _num("{:,}")),
            Column("rate", "calls/s", _num("{:,.0f}")),
            Column("p50", "call p50 µs", us),
            Column("p99", "call p99 µs", us),
            Column("skipped", "skipped (timeout)", _num("{:,}")),
            Column("overlaps", "overlaps", _num("{}")),
            Column("mismatched", "mismatched names", _num("{}")),
            Column("names", "names used", _num("{:,}")),
            Column("top", "top name %", _num("{:.1f}")),
        ),
        ratio_metric="rate",
        notes=_notes,
        smoke=smoke,
    )
)

_CASES = (
    ("pg.advisory", functools.partial(MixedClient, peer="advisory"),
     "`pg_advisory_lock`, minimal decorator", "postgres", "peer"),
    ("pg.lease", functools.partial(MixedClient, alias="pg"), "`@distlock`, lease mode",
     "postgres", None),
    ("pg.tx", functools.partial(MixedClient, alias="pg-tx"), "`@distlock`, transaction mode",
     "postgres", None),
    ("redis.redis-py", functools.partial(MixedClient, peer="redis-py"),
     "redis-py `Lock`, minimal decorator", "redis", "peer"),
    ("redis.distlock", functools.partial(MixedClient, alias="redis"), "`@distlock`, Redis",
     "redis", None),
    ("redlock.distlock", functools.partial(MixedClient, alias="redlock"),
     "`@distlock`, Redlock (5 masters)", "redlock", None),
    ("cluster.distlock", functools.partial(MixedClient, alias="redis-cluster"),
     "`@distlock`, Redis Cluster", "cluster", None),
    ("zk.kazoo", functools.partial(MixedClient, peer="kazoo"), "kazoo `Lock`, minimal decorator",
     "zookeeper", "peer"),
    ("zk.distlock", functools.partial(MixedClient, alias="zk"), "`@distlock`, ZooKeeper ensemble",
     "zookeeper", None),
    ("cache.distlock", functools.partial(MixedClient, alias="cache-memcached"),
     "`@distlock`, memcached cache backend", "memcached", None),
)
for _name, _factory, _what, _group, _ref in _CASES:
    add_case(NAME, _name, _factory, _what, group=_group, reference=_ref)
