"""Suite ``asyncio``: 1,000 asyncio tasks on 10 keys in one process, beside 4 thread processes.

Issue 10's figure for contended asyncio waiters: every task served, event-loop
lag p99 under 5 ms. Per case, five OS processes are started (``spawn``), each
with its own Django setup and connections, all on the same :data:`KEYS` keys:

- the *tasks* process runs :data:`TASKS` asyncio tasks in one event loop, task
  ``i`` on key ``i % KEYS``, each with its own :class:`~benchmarks.harness.AsyncLocker`.
  Each task loops until the round's deadline (``duration`` seconds): ``await
  aacquire()`` (blocking, with the case's timeout), note ``monotonic_ns()``,
  hold by ``await asyncio.sleep(hold_ms)``, note ``monotonic_ns()``, ``await
  arelease()``. An acquire started before the deadline runs to its end, so
  every task makes at least one. Beside them a *ticker* coroutine sleeps 1 ms at
  a time and records how late it wakes: the loop lag, which every other
  coroutine of that process (an ASGI view, say) would suffer too.
- :data:`THREAD_PROCESSES` *thread processes* each run one thread that takes
  the same keys one after the other (acquire, hold by ``time.sleep``, release),
  each starting at a different key, until the tasks process is done.

Before the round's barrier every process opens its connections (the tasks
process by running :data:`WARM_TASKS` tasks at once, which opens its pooled
sessions). ``CLOCK_MONOTONIC`` is system-wide on Linux, so every grant merges
into one history per key: overlaps (must be 0) are checked over all of it;
grant counts and handoffs (previous holder's just-before-release on that key →
this grant's acquire-return) over the steady-state window, from the last
process' start plus a warm-up to the tasks' deadline. Every loop is bounded in
count and in time; a round that overruns its bound fails the run.

``DISTLOCK_BENCH_SWITCH_INTERVAL`` (seconds) sets the tasks process' GIL switch
interval (``sys.setswitchinterval``; Python's default 0.005): a controlled run for the
PostgreSQL rows, whose pool threads compete with the loop's thread for the GIL.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from .asyncio_analysis import (
    LAG_BAR_MS,
    LAG_METRIC,
    RoundResult,
    TaskReport,
    analyse,
    summarise,
)
from .contention import STARTUP_TIMEOUT, _get, _worker_failure
from .harness import (
    AsyncLocker,
    Case,
    Column,
    LockerFactory,
    NotAcquired,
    Options,
    Row,
    Suite,
    add_bar,
    add_case,
    add_suite,
    progress,
)

NAME = "asyncio"
TASKS = 1000
KEYS = 10
THREAD_PROCESSES = 4
#: How long one acquire of a task (or a thread) may wait: the case's factory sets
#: it, the suite's time bounds count on it.
TASK_TIMEOUT = 5.0
#: Tasks run at once before the round, to open the tasks process' connections.
WARM_TASKS = 64
#: The ticker's sleep.
TICK = 0.001
#: Bounds on every loop: acquires per task or thread process, ticks per round.
MAX_ACQUIRES = 1_000_000
MAX_TICKS = 1_000_000
#: Added to ``duration + TASK_TIMEOUT`` for the longest a round may take.
SLACK = 30.0

#: Groups (servers) whose locks are process-local (locmem): thread processes would not
#: contend with the tasks, so their cases run the tasks process alone.
LOCAL_GROUPS = frozenset({"locmem"})


def _limit(duration: float) -> float:
    """Longest a round's tasks may run (past it the round fails): the deadline, one
    acquire started just before it, and slack for a loaded machine."""
    return duration + TASK_TIMEOUT + SLACK


# --------------------------------------------------------------------------- the processes


def _thread_worker(
    factory: Any,
    keys: list[str],
    index: int,
    rounds: int,
    duration: float,
    hold_s: float,
    barrier: Any,
    stop: Any,
    results: Any,
) -> None:
    """A thread process: one thread takes the keys in turn until told to stop."""
    lockers = []
    try:
        lockers = [factory(key) for key in keys]
        first = lockers[index % len(keys)]
        if first.acquire():  # open every connection before the clock starts
            first.release()
        clock, sleep = time.monotonic_ns, time.sleep
        for round_ in range(rounds):
            barrier.wait(STARTUP_TIMEOUT)
            start = clock()
            hard = start + int((_limit(duration) + SLACK) * 1e9)  # the parent fails first
            grants: list[tuple[int, int, int]] = []
            timeouts, turn = 0, index
            while len(grants) + timeouts < MAX_ACQUIRES and clock() < hard and not stop.is_set():
                key, turn = turn % len(keys), turn + 1
                locker = lockers[key]
                if not locker.acquire():
                    timeouts += 1
                    continue
                acquired = clock()
                if hold_s:
                    sleep(hold_s)
                releasing = clock()
                locker.release()
                grants.append((key, acquired, releasing))
            results.put(("threads", index, round_, start, grants, timeouts))
    except BaseException:
        results.put(("error", f"thread process {index}", os.getpid(), traceback.format_exc()))
        barrier.abort()
    finally:
        for locker in lockers:
            locker.close()


def _tasks_worker(
    factory: Any,
    keys: list[str],
    rounds: int,
    duration: float,
    hold_s: float,
    barrier: Any,
    results: Any,
) -> None:
    """The tasks process: one event loop, :data:`TASKS` tasks and the ticker per round."""
    lockers: list[AsyncLocker] = []
    try:
        if os.environ.get("DISTLOCK_BENCH_SWITCH_INTERVAL"):  # a controlled run: the GIL's
            sys.setswitchinterval(float(os.environ["DISTLOCK_BENCH_SWITCH_INTERVAL"]))
        lockers = [factory(keys[i % len(keys)]) for i in range(TASKS)]
        asyncio.run(_tasks_main(lockers, rounds, duration, hold_s, barrier, results))
    except BaseException:
        results.put(("error", "tasks process", os.getpid(), traceback.format_exc()))
        barrier.abort()
    finally:
        for locker in lockers:  # outside the event loop: closing may block
            locker.close()


async def _tasks_main(
    lockers: list[AsyncLocker],
    rounds: int,
    duration: float,
    hold_s: float,
    barrier: Any,
    results: Any,
) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.gather(*(_once(locker) for locker in lockers[:WARM_TASKS]))
    for round_ in range(rounds):
        await loop.run_in_executor(None, barrier.wait, STARTUP_TIMEOUT)
        start, deadline, per_task, lags = await _round(lockers, duration, hold_s)
        results.put(("tasks", -1, round_, start, deadline, per_task, lags))


async def _once(locker: AsyncLocker) -> None:
    if await locker.aacquire():
        await locker.arelease()


async def _round(
    lockers: list[AsyncLocker], duration: float, hold_s: float
) -> tuple[int, int, list[TaskReport], list[tuple[int, int]]]:
    """One round: every task's grants, waits and timeouts, and the ticker's ticks
    (ns since the round's start, ns late)."""
    clock = time.monotonic_ns
    start = clock()
    deadline = start + int(duration * 1e9)
    tick_ns = int(TICK * 1e9)
    lags: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set() and len(lags) < MAX_TICKS:
            t0 = clock()
            await asyncio.sleep(TICK)
            lags.append((t0 - start, clock() - t0 - tick_ns))

    async def task(key: int, locker: AsyncLocker) -> TaskReport:
        grants: list[tuple[int, int]] = []
        waits: list[int] = []
        timeouts = 0
        while clock() < deadline and len(grants) + timeouts < MAX_ACQUIRES:
            t0 = clock()
            if not await locker.aacquire():
                timeouts += 1
                continue
            acquired = clock()
            waits.append(acquired - t0)
            if hold_s:
                await asyncio.sleep(hold_s)
            releasing = clock()
            await locker.arelease()
            grants.append((acquired, releasing))
        return key, grants, waits, timeouts

    ticking = asyncio.create_task(ticker())
    tasks = [task(i % KEYS, locker) for i, locker in enumerate(lockers)]
    try:
        per_task = await asyncio.wait_for(asyncio.gather(*tasks), _limit(duration))
    except TimeoutError:
        raise RuntimeError(
            f"the tasks were not done {_limit(duration):g} s after the round started, though "
            f"each acquire times out after {TASK_TIMEOUT:g} s"
        ) from None
    finally:
        done.set()
        await ticking
    return start, deadline, list(per_task), lags


def run_processes(
    factory: Any,
    keys: list[str],
    rounds: int,
    duration: float,
    hold_ms: float,
    threads: int = THREAD_PROCESSES,
) -> list[RoundResult]:
    """Run the tasks process and ``threads`` thread processes for ``rounds`` rounds.

    :raises RuntimeError: with a process' traceback when one fails, or when a
        round overruns its bound.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(threads + 2)  # and this process, which knows the start
    stop, results = ctx.Event(), ctx.Queue()
    hold_s = hold_ms / 1000.0
    procs = [
        ctx.Process(
            target=_tasks_worker,
            args=(factory, keys, rounds, duration, hold_s, barrier, results),
            name="bench-asyncio-tasks",
            daemon=True,
        )
    ]
    procs += [
        ctx.Process(
            target=_thread_worker,
            args=(factory, keys, i, rounds, duration, hold_s, barrier, stop, results),
            name=f"bench-asyncio-threads-{i}",
            daemon=True,
        )
        for i in range(threads)
    ]
    for proc in procs:
        proc.start()
    history: list[RoundResult] = []
    try:
        for _ in range(rounds):
            stop.clear()  # the thread processes look at it only after the barrier
            try:
                barrier.wait(STARTUP_TIMEOUT)
            except threading.BrokenBarrierError:
                raise _worker_failure(results, "before a round started") from None
            got: list[tuple[Any, ...]] = []
            while not any(m[0] == "tasks" for m in got):
                got.append(_get(results, _limit(duration) + STARTUP_TIMEOUT))
            stop.set()
            while len(got) < threads + 1:
                got.append(_get(results, STARTUP_TIMEOUT))
            history.append(_collect(got, threads))
    finally:
        stop.set()
        barrier.abort()  # frees any process still waiting if we failed
        for proc in procs:
            proc.join(timeout=30)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # only our own children, by handle
                proc.join(timeout=5)
    return history


def _collect(messages: list[tuple[Any, ...]], threads: int) -> RoundResult:
    (tasks,) = [m for m in messages if m[0] == "tasks"]
    _, _, _, start, deadline, per_task, lags = tasks
    thread_starts = [0] * threads
    thread_grants: list[list[tuple[int, int, int]]] = [[] for _ in range(threads)]
    thread_timeouts = 0
    for message in messages:
        if message[0] == "threads":
            _, index, _, thread_start, grants, timeouts = message
            thread_starts[index], thread_grants[index] = thread_start, grants
            thread_timeouts += timeouts
    return RoundResult(
        start, deadline, per_task, lags, thread_starts, thread_grants, thread_timeouts
    )


# --------------------------------------------------------------------------- the suite


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """Run every case's processes; return one row per case."""
    warmup = min(0.5, options.duration / 5)
    rows = []
    for case in cases:
        threads = 0 if case.group in LOCAL_GROUPS else THREAD_PROCESSES
        progress(
            f"{NAME}: {case.name}, {TASKS} tasks on {KEYS} keys beside {threads} "
            f"thread processes, {options.repeat} round(s) x {options.duration:g} s"
        )
        keys = [f"bench:{NAME}:{case.name}:{k}" for k in range(KEYS)]
        history = run_processes(
            case.factory, keys, options.repeat, options.duration, options.hold_ms, threads
        )
        rows.append(Row(case, summarise([analyse(r, warmup) for r in history])))
    return rows


def add(name: str, factory: LockerFactory, what: str, *, group: str) -> None:
    """Register a case of this suite (``factory`` builds an :class:`AsyncLocker`) and its
    bar: the loop lag's p99 under :data:`LAG_BAR_MS` (printed as a ratio to it, at most 1x).
    """
    add_case(NAME, name, factory, what, group=group)
    add_bar(NAME, name, None, 1.0, LAG_METRIC)


def smoke(case: Case) -> None:
    """``--smoke``: one acquire+release from a thread, then one from a task.

    :raises NotAcquired: when the free key is not acquired.
    """
    locker: Any = case.factory(f"bench:smoke:{case.suite}:{case.name}")

    async def once() -> None:
        if not await locker.aacquire():
            raise NotAcquired(f"{case.suite} {case.name}: a task did not acquire a free key")
        await locker.arelease()

    try:
        if not locker.acquire():
            raise NotAcquired(f"{case.suite} {case.name}: a thread did not acquire a free key")
        locker.release()
        asyncio.run(once())
    finally:
        locker.close()


def _overlaps(value: Any) -> str:
    return str(value) if value == 0 else f"**{value}**"


def _notes(options: Options) -> str:
    return (
        f"One process runs {TASKS:,} asyncio tasks, task i on key i % {KEYS}, beside "
        f"{THREAD_PROCESSES} OS processes (spawn) of one thread each that take the same "
        f"{KEYS} keys in turn; {options.repeat} round(s): the tasks loop for "
        f"{options.duration:g} s (an acquire started before then runs to its end; "
        f"every acquire times out after {TASK_TIMEOUT:g} s), the threads until the tasks are "
        f"done; hold {options.hold_ms:g} ms (`asyncio.sleep` / `time.sleep`). "
        "served = tasks with at least one grant; timeouts = acquires that returned False "
        "(tasks / threads); grants per process in the steady-state window (the first "
        f"{min(0.5, options.duration / 5):g} s left out), summed over rounds; tasks / thread "
        "process = the tasks' grants over a thread process' mean; first grant = round start → "
        "a task's first grant; task acquire = `aacquire()` call → return, granted ones; "
        "handoff = previous holder's just-before-release on the key → this grant's "
        "acquire-return (`CLOCK_MONOTONIC`); loop lag = how late a coroutine sleeping "
        f"{TICK * 1000:g} ms wakes, every tick of the round (bar: p99 < {LAG_BAR_MS:g} ms, "
        "printed below the table as the p99 over the bar, at most 1x), "
        "and when the worst tick began (since its round's start); "
        "overlaps per key over every grant. A process-local backend (locmem) runs the tasks "
        "process alone: other processes would not contend with it."
    )


SUITE = add_suite(
    Suite(
        name=NAME,
        title=f"Contended asyncio waiters: {TASKS:,} tasks on {KEYS} keys beside "
        f"{THREAD_PROCESSES} thread processes",
        run=run,
        columns=(
            Column("served", "tasks served"),
            Column("all_served", "all served"),
            Column("timeouts", "timeouts tasks / threads"),
            Column("task_grants", "grants: tasks"),
            Column("thread_grants", "grants per thread process"),
            Column("share", "tasks / thread process", lambda v: f"{v:.1f}x".replace("nan", "n/a")),
            Column("rate", "acq/s", lambda v: f"{v:,.0f}"),
            Column("first", "first grant p50 / p99 / max ms"),
            Column("wait", "task acquire p50 / p99 ms"),
            Column("handoff", "task handoff p50 / p99 µs"),
            Column("thread_handoff", "thread handoff p50 / p99 µs"),
            Column("lag", "loop lag p50 / p99 / max ms"),
            Column("worst_lag_at", "max lag at"),
            Column("lag_ok", f"lag p99 < {LAG_BAR_MS:g} ms"),
            Column("overlaps", "overlaps", _overlaps),
        ),
        ratio_metric="handoff_p50",
        notes=_notes,
        smoke=smoke,
    )
)
