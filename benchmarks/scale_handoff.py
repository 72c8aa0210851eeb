"""Suite ``scale.handoff``: hand-off on ONE name with 8, 100 and 1,000 waiters (issue 26, item 3).

Per case and per size N, :data:`PROCESSES` OS processes are started (``spawn``), each
with its own Django setup and clients, N / :data:`PROCESSES` waiters each: the first
half of the processes run them as threads, the other half as asyncio tasks (a case
without an async API, the peers, runs threads everywhere; PostgreSQL runs tasks
everywhere once the threads would need more sessions than :data:`PG_THREAD_SESSIONS`,
see below). Every waiter opens its connections and takes the name once before the
round; each round, every waiter loops until the parent stops it: acquire (blocking, with
:data:`WAIT` as its timeout), ``monotonic_ns()``, hold by sleeping ``--hold-ms``,
``monotonic_ns()``, release. ``CLOCK_MONOTONIC`` is system-wide on Linux, so the grants
of every waiter merge into one history: hand-off = the previous holder's
just-before-release → this grant's acquire-return.

Counted over the steady-state window (the parent's clock: it starts once as many grants
as waiters have been made since the round began, every waiter back in the queue, and
lasts ``--duration``; then the parent tells the waiters to stop): grants per second,
hand-off p50/p99, and the requests the server handled per grant:

- Redis and Redlock: top-level commands from ``MONITOR`` (a line per command; the
  commands a script runs are the lines tagged ``lua`` and are left out: ``INFO
  commandstats`` counts them under their own names too and cannot tell them apart),
  summed over the masters;
- ZooKeeper: ``zk_packets_received`` of ``mntr``, summed over the ensemble;
- memcached: ``stats`` ``cmd_get + cmd_set + cmd_touch + delete_* + incr_* + decr_*``;
- PostgreSQL: statements the clients sent (psycopg ``Cursor.execute`` calls, counted
  in each process): ``pg_stat_statements`` is not loaded on the servers and
  ``pg_stat_database``'s counters reach the server from a busy session at most once a
  second (10 s when idle), too late for a window of seconds.

Sizes: :data:`DEFAULT_SIZES` (8 and 100) by default, which keeps the run short; the
full sizes with ``DISTLOCK_BENCH_WAITERS=8,100,1000`` (any comma-separated sizes, each
a multiple of :data:`PROCESSES`). PostgreSQL: a waiting thread sleeps in the server on
a session of its own, so 1,000 thread waiters need 1,000 sessions (the servers allow
``max_connections``, 100 by default); past :data:`PG_THREAD_SESSIONS` thread waiters
the PostgreSQL cases run asyncio tasks in every process, which share each process'
``ASYNC_SESSIONS`` (16) sessions: the layout column says which ran. Transaction mode
holds a transaction (a session) per waiter, threads and tasks alike: it runs up to
:data:`PG_THREAD_SESSIONS` waiters only (at 1,000 its tasks' sessions ran into the
server's ``statement_timeout`` while queued).

``DISTLOCK_BENCH_LAYOUT`` runs every size with one layout: ``tasks`` (tasks in every
process) or ``threads`` (threads in every process; a size whose threads would need more
sessions than a case allows is skipped); ``mixed`` is the default above. Also per size:
ZooKeeper's listings per grant (``get_children`` requests counted in the waiters), the
waiter processes' CPU per grant and, with ``DISTLOCK_BENCH_SERVER_PID`` naming a local
server process (PostgreSQL's postmaster: its backends are counted too; a ZooKeeper JVM),
the server's CPU per grant, both from ``/proc`` over the window. Rows ``zk1.*``: the
standalone ZooKeeper of ``DISTLOCK_ZK_STANDALONE``.
"""

from __future__ import annotations

import asyncio
import functools
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import cache, pg, redis, redlock, zookeeper
from .contention import STARTUP_TIMEOUT, _get, _worker_failure
from .harness import (
    Case,
    Column,
    NotAcquired,
    Options,
    Row,
    Suite,
    Unavailable,
    add_bar,
    add_case,
    add_suite,
    percentile,
    progress,
    ratio,
    us,
)
from .scale_handoff_peers import KazooLock, PythonRedisLock
from .scale_handoff_requests import ServerCount, cpu_ns, server_cpu_ns
from .scale_handoff_waiters import ROUND_LIMIT, WAIT, Grant, Shared, worker

NAME = "scale.handoff"
PROCESSES = 4
DEFAULT_SIZES = (8, 100)
#: Thread waiters a PostgreSQL case may run (each a session of its own).
PG_THREAD_SESSIONS = 100
#: Bars: p50 at the largest size over p50 at the smallest; requests per grant likewise.
P50_BAR, REQUESTS_BAR = 1.3, 1.1


def sizes() -> tuple[int, ...]:
    """The waiter counts of this run (``DISTLOCK_BENCH_WAITERS``, default 8,100)."""
    raw = os.environ.get("DISTLOCK_BENCH_WAITERS", "")
    got = tuple(int(x) for x in raw.split(",") if x.strip()) or DEFAULT_SIZES
    if any(n < PROCESSES or n % PROCESSES for n in got):
        raise ValueError(f"DISTLOCK_BENCH_WAITERS: each size a multiple of {PROCESSES}")
    return got


def setup() -> None:
    """The peers' servers (Redis and ZooKeeper) must be configured.

    :raises Unavailable: when one is not.
    """
    for variable in ("DISTLOCK_REDIS_URL", "DISTLOCK_ZK_HOSTS"):
        if not os.environ.get(variable):
            raise Unavailable(f"{variable} is not set (the peers' server)")


def describe() -> str:
    """Nothing of its own: the servers are described by their modules."""
    return f"scale.handoff sizes {','.join(map(str, sizes()))}, layout {chosen_layout()}"


# --------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Plan:
    """How a case runs: with tasks or not, its thread cap, what counts its requests."""

    tasks: bool
    counter: str  # redis | redlock | zookeeper | memcached | postgres
    max_threads: int | None = None
    #: Sizes past it are not run: every waiter needs a server session of its own.
    max_waiters: int | None = None


PLANS: dict[str, Plan] = {}


def _case(name: str, factory: Any, what: str, group: str, plan: Plan, ref: str | None = None
          ) -> None:
    add_case(NAME, name, factory, what, group=group, reference=ref)
    PLANS[name] = plan
    if plan.tasks:
        add_bar(NAME, name, None, P50_BAR, metric="p50_growth")
        add_bar(NAME, name, None, REQUESTS_BAR, metric="requests_growth")


def _ours(module: Any, alias: str) -> Any:
    return functools.partial(module.DistLock, alias=alias, timeout=WAIT)


# The peers' factories are this module's (a case belongs to its factory's module, which
# the harness sets up): their lockers are in scale_handoff_peers.
def _kazoo(key: str, target: str = "zk") -> KazooLock:
    return KazooLock(key, target=target)


def _python_redis_lock(key: str) -> PythonRedisLock:
    return PythonRedisLock(key)


_case("redis.distlock", _ours(redis, "redis-1k"), "django-distlock `RedisBackend`, pool of 300",
      redis.GROUP,
      Plan(True, "redis"))
_case("redis.python-redis-lock", _python_redis_lock, "python-redis-lock (threads)", redis.GROUP,
      Plan(False, "redis"), ref="python-redis-lock")
_case("redlock.distlock", _ours(redlock, "redlock"), "django-distlock `RedlockBackend`, 5 masters",
      redlock.GROUP, Plan(True, "redlock"))
_case("pg.lease", _ours(pg, "pg"), "django-distlock lease mode", pg.GROUP,
      Plan(True, "postgres", PG_THREAD_SESSIONS))
_case("pg.tx", _ours(pg, "pg-tx"), "django-distlock transaction mode", pg.GROUP,
      Plan(True, "postgres", PG_THREAD_SESSIONS, max_waiters=PG_THREAD_SESSIONS))
_case("zk.distlock", _ours(zookeeper, "zk"), "django-distlock, 3-node ensemble", zookeeper.GROUP,
      Plan(True, "zookeeper"))
_case("zk.kazoo", _kazoo, "kazoo `Lock` (threads), 3-node ensemble", zookeeper.GROUP,
      Plan(False, "zookeeper"), ref="kazoo")
_case("zk1.distlock", _ours(zookeeper, "zk1"), "django-distlock, standalone ZooKeeper",
      zookeeper.GROUP, Plan(True, "zookeeper1"))
_case("zk1.kazoo", functools.partial(_kazoo, target="zk1"),
      "kazoo `Lock` (threads), standalone ZooKeeper", zookeeper.GROUP,
      Plan(False, "zookeeper1"), ref="kazoo-standalone")
_case("cache.distlock", _ours(cache, "cache-memcached"),
      "django-distlock `CacheBackend`, memcached", cache.GROUP, Plan(True, "memcached"))


#: ``DISTLOCK_BENCH_LAYOUT``: ``mixed`` (the default: half the processes threads, half
#: tasks), ``tasks`` (tasks in every process, threads for a case without them) or
#: ``threads`` (threads in every process; a size whose threads a case cannot run is
#: skipped), so that every size of a case can be run with one layout.
LAYOUTS = ("mixed", "tasks", "threads")


def chosen_layout() -> str:
    """The layout asked for by ``DISTLOCK_BENCH_LAYOUT`` (default ``mixed``).

    :returns: one of :data:`LAYOUTS`.
    :raises ValueError: for another value.
    """
    got = os.environ.get("DISTLOCK_BENCH_LAYOUT", "").strip() or "mixed"
    if got not in LAYOUTS:
        raise ValueError(f"DISTLOCK_BENCH_LAYOUT: one of {', '.join(LAYOUTS)}, not {got!r}")
    return got


def layout(plan: Plan, waiters: int) -> list[str] | None:
    """Per process: ``threads`` or ``tasks``; None when the chosen layout cannot run
    ``waiters`` (threads past the case's session cap)."""
    half, chosen = PROCESSES // 2, chosen_layout()
    tasks = "tasks" if plan.tasks else "threads"
    if chosen == "tasks":
        modes = [tasks] * PROCESSES
    elif chosen == "threads":
        modes = ["threads"] * PROCESSES
    else:
        modes = ["threads"] * half + [tasks] * (PROCESSES - half)
    threads = modes.count("threads") * waiters // PROCESSES
    if plan.max_threads is not None and threads > plan.max_threads:
        if chosen == "threads":
            return None
        modes = ["tasks"] * PROCESSES
    return modes


@dataclass
class Measured:
    """One round of one size: what the table shows."""

    grants: int
    seconds: float
    handoffs: list[int]
    requests: int
    reply_bytes: int | None  # the server's bytes to its clients, where it counts them
    listings: int | None  # ZooKeeper: ``get_children`` requests the waiters sent
    timeouts: int
    overlaps: int
    cpu_ns: int | None = None  # the local server's CPU time (DISTLOCK_BENCH_SERVER_PID)
    client_ns: int = 0  # the waiter processes' CPU time


def run_size(case: Case, waiters: int, options: Options) -> list[Measured]:
    """Run ``waiters`` waiters of ``case`` for ``options.repeat`` rounds.

    :raises RuntimeError: with a process' traceback when one fails.
    """
    plan = PLANS[case.name]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES + 1), ctx.Queue()
    shared = Shared(ctx.Value("q", 0), ctx.Value("q", 0), ctx.Event())
    key = f"scale:handoff:{case.name}:{waiters}"
    procs = [
        ctx.Process(target=worker, daemon=True, name=f"bench-handoff-{i}", args=(
            case.factory, key, mode, waiters // PROCESSES, options.repeat,
            options.hold_ms / 1000, shared, barrier, results, plan.counter))
        for i, mode in enumerate(layout(plan, waiters) or ())
    ]
    for proc in procs:
        proc.start()
    measured = []
    try:
        for _ in range(options.repeat):
            shared.stop.clear()  # the waiters look at it only after the barrier
            try:
                barrier.wait(STARTUP_TIMEOUT + WAIT)
            except threading.BrokenBarrierError:
                raise _worker_failure(results, "before a round started") from None
            pids = [p.pid for p in procs if p.pid is not None]
            first, last, requests, sent, (cpu, client), listed = _window(
                plan, waiters, options, shared, pids)
            shared.stop.set()
            got = [_get(results, ROUND_LIMIT + WAIT) for _ in range(PROCESSES)]
            measured.append(_measure(got, first, last, requests, sent))
            measured[-1].cpu_ns, measured[-1].client_ns = cpu, client
            if plan.counter.startswith("zookeeper"):
                measured[-1].listings = listed
    finally:
        shared.stop.set()
        barrier.abort()
        for proc in procs:
            proc.join(timeout=WAIT + 30)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # only our own children, by handle
                proc.join(timeout=5)
    return measured


def _window(plan: Plan, waiters: int, options: Options, shared: Shared, pids: list[int]
            ) -> tuple[int, int, int, int | None, tuple[int | None, int], int]:
    """Wait for the steady state (the warm-up, and as many grants as waiters: every
    waiter back in the queue once), count the server's requests for ``duration``
    seconds; return the window's ends (ns), the requests, the bytes replied, the
    local server's CPU ns (None when not asked for) with the waiter processes' (``pids``),
    and the listings the waiters sent."""
    start, base = time.monotonic(), shared.granted.value
    settle = start + min(0.5, options.duration / 5)
    while time.monotonic() < settle or shared.granted.value - base < waiters:
        if time.monotonic() > start + WAIT:  # a collapse to show, not to fail on
            progress(f"{NAME}: only {shared.granted.value - base} of {waiters} grants "
                     f"within {WAIT:g} s; the window starts now")
            break
        time.sleep(0.01)
    server = ServerCount(plan.counter, shared.statements)
    cpu, client, listed = server_cpu_ns(), cpu_ns(pids), shared.statements.value
    first = time.monotonic_ns()
    server.start()
    time.sleep(options.duration)
    requests = server.stop()
    last, cpu_after = time.monotonic_ns(), server_cpu_ns()
    used = None if cpu is None or cpu_after is None else cpu_after - cpu
    client = cpu_ns(pids) - client
    return (first, last, requests, server.reply_bytes, (used, client),
            shared.statements.value - listed)


def _measure(got: list[Any], first: int, last: int, requests: int, sent: int | None,
             listings: int | None = None) -> Measured:
    grants: list[Grant] = []
    timeouts = 0
    for _, _, out in got:
        for waiter_grants, waiter_timeouts in out:
            grants += waiter_grants
            timeouts += waiter_timeouts
    grants.sort()
    overlaps, handoffs, counted = 0, [], 0
    for i, (acquired, _) in enumerate(grants):
        if i and acquired < grants[i - 1][1]:
            overlaps += 1
        if first <= acquired <= last:
            counted += 1
            if i:
                handoffs.append(acquired - grants[i - 1][1])
    return Measured(counted, (last - first) / 1e9, handoffs, requests, sent, listings, timeouts,
                    overlaps)


# --------------------------------------------------------------------------- the suite


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """Run every case at every size; one row per case."""
    rows = []
    for case in cases:
        values: dict[int, tuple[list[str], list[Measured]]] = {}
        for waiters in sizes():
            limit = PLANS[case.name].max_waiters
            if limit is not None and waiters > limit:
                progress(f"{NAME}: {case.name}, {waiters} waiters: not run (one session each)")
                continue
            modes = layout(PLANS[case.name], waiters)
            if modes is None:
                progress(f"{NAME}: {case.name}, {waiters} waiters: not run (threads, a "
                         "session each)")
                continue
            progress(f"{NAME}: {case.name}, {waiters} waiters ({'/'.join(modes)}), "
                     f"{options.repeat} round(s) x {options.duration:g} s")
            values[waiters] = (modes, run_size(case, waiters, options))
        rows.append(Row(case, summarise(values)))
    return rows


def summarise(by_size: dict[int, tuple[list[str], list[Measured]]]) -> dict[str, Any]:
    """Each size's figures as ``a / b / c`` cells, and the largest size over the smallest."""
    p50, p99, rate, req, lay, sent, listed, cpu, client = {}, {}, {}, {}, {}, {}, {}, {}, {}
    timeouts = overlaps = 0
    for n, (modes, rounds) in by_size.items():
        handoffs = sorted(h for m in rounds for h in m.handoffs)
        grants = sum(m.grants for m in rounds)
        p50[n], p99[n] = percentile(handoffs, 50), percentile(handoffs, 99)
        rate[n] = grants / sum(m.seconds for m in rounds)
        req[n] = sum(m.requests for m in rounds) / grants if grants else math.nan
        replied = [m.reply_bytes for m in rounds if m.reply_bytes is not None]
        sent[n] = sum(replied) / grants if grants and replied else math.nan
        lists = [m.listings for m in rounds if m.listings is not None]
        listed[n] = sum(lists) / grants if grants and lists else math.nan
        used = [m.cpu_ns for m in rounds if m.cpu_ns is not None]
        cpu[n] = sum(used) / 1000 / grants if grants and used else math.nan
        client[n] = sum(m.client_ns for m in rounds) / 1000 / grants if grants else math.nan
        lay[n] = f"{modes.count('threads')}T+{modes.count('tasks')}A"
        timeouts += sum(m.timeouts for m in rounds)
        overlaps += sum(m.overlaps for m in rounds)
    small, big = min(by_size), max(by_size)

    def cells(values: dict[int, float], fmt: Callable[[float], str]) -> str:
        return " / ".join(fmt(values[n]) for n in by_size)

    return {
        "sizes": " / ".join(f"{n:,}" for n in by_size),
        "layout": " / ".join(lay.values()),
        "p50": cells(p50, us),
        "p99": cells(p99, us),
        "rate": cells(rate, lambda v: f"{v:,.0f}"),
        "requests": cells(req, lambda v: f"{v:.2f}"),
        "bytes": cells(sent, lambda v: "n/a" if math.isnan(v) else f"{v:,.0f}"),
        "listings": cells(listed, lambda v: "n/a" if math.isnan(v) else f"{v:.2f}"),
        "cpu": cells(cpu, lambda v: "n/a" if math.isnan(v) else f"{v:,.0f}"),
        "client": cells(client, lambda v: "n/a" if math.isnan(v) else f"{v:,.0f}"),
        "p50_big": p50[big],
        "p50_growth": p50[big] / p50[small],
        "requests_growth": req[big] / req[small],
        "timeouts": timeouts,
        "overlaps": overlaps,
    }


def smoke(case: Case) -> None:
    """``--smoke``: one acquire+release from a thread (and a task when the case has
    tasks), and the case's server counter read once.

    :raises NotAcquired: when the free key is not acquired.
    """
    plan = PLANS[case.name]
    server = ServerCount(plan.counter)
    server.start()
    locker: Any = case.factory(f"scale:smoke:{case.name}")

    async def once() -> None:
        if not await locker.aacquire():
            raise NotAcquired(f"{case.name}: a task did not acquire a free key")
        await locker.arelease()

    try:
        if not locker.acquire():
            raise NotAcquired(f"{case.name}: a thread did not acquire a free key")
        locker.release()
        if plan.tasks:
            asyncio.run(once())
    finally:
        locker.close()
        server.stop()


def _notes(options: Options) -> str:
    return (
        f"Waiters on one name: {PROCESSES} OS processes (spawn), layout per size "
        "(T = processes of threads, A = of asyncio tasks), "
        f"{options.repeat} round(s) x {options.duration:g} s, hold {options.hold_ms:g} ms "
        "(sleep); stats over a window of the duration that starts once as many grants as "
        "waiters have been made (every waiter back in the queue). Cells: one per size, in "
        "the order of the waiters column. handoff = "
        "previous holder's just-before-release → this grant's acquire-return "
        "(`CLOCK_MONOTONIC`, µs); requests/grant: Redis and Redlock top-level commands "
        "(`MONITOR`, script-inner commands left out, summed over masters), ZooKeeper "
        "`zk_packets_received` (ensemble), memcached `cmd_*` + `delete_*` + `incr/decr_*`, "
        "PostgreSQL statements the clients sent (psycopg `execute`); reply bytes/grant: "
        "ZooKeeper `zk_response_bytes`, memcached `bytes_written`; listings/grant: "
        "ZooKeeper `get_children` requests the waiters sent (kazoo `_call`); server CPU "
        "µs/grant: user + system time of the local server process "
        "`DISTLOCK_BENCH_SERVER_PID` names and its children over the window (`/proc`; "
        "n/a when not set; 10 ms ticks); client CPU µs/grant: the same of the waiter "
        "processes; p50 growth and "
        "requests growth = largest size's value / smallest size's; `x ref` = p50 at the "
        "largest size / the peer's. Sizes: `DISTLOCK_BENCH_WAITERS` (default 8,100)."
    )


SUITE = add_suite(
    Suite(
        name=NAME,
        title="Scale: hand-off on one name as waiters multiply",
        run=run,
        columns=(
            Column("sizes", "waiters"),
            Column("layout", "layout"),
            Column("p50", "handoff p50 µs"),
            Column("p99", "handoff p99 µs"),
            Column("rate", "grants/s"),
            Column("requests", "requests/grant"),
            Column("bytes", "reply bytes/grant"),
            Column("listings", "listings/grant"),
            Column("cpu", "server CPU µs/grant"),
            Column("client", "client CPU µs/grant"),
            Column("p50_growth", "p50 growth", ratio),
            Column("requests_growth", "requests growth", ratio),
            Column("timeouts", "timeouts"),
            Column("overlaps", "overlaps"),
        ),
        ratio_metric="p50_big",
        notes=_notes,
        smoke=smoke,
    )
)
