"""Suite ``contended``: N OS processes fight over one key; the merged history is analysed.

Generic over a :class:`~benchmarks.harness.Locker` factory, so any backend's
cases can use it. Per case, ``processes`` workers are started with the
``spawn`` context (each builds its own Locker: its own Django setup and
connections) and take one untimed acquire+release to open their
connections. Each round they pass a barrier together, then loop for
``duration`` seconds: acquire (blocking, with the case's timeout), note
``monotonic_ns()`` when acquire returns, hold the lock by *sleeping*
``hold_ms`` (a busy-wait would take a CPU from the server and the waiters on
a small machine), note ``monotonic_ns()`` just before calling release,
release. ``CLOCK_MONOTONIC`` is system-wide on Linux, so the grants of all
processes merge into one history.

From that history (see :func:`analyse`): grants per second, handoff latency
(from one holder's just-before-release to the next grant's acquire-return),
grants per process, and overlapping holds (must be 0). Only grants inside the
steady-state window count for the rates: from the last process' start plus a
warm-up (first waits open connections and the like) to the first
process' deadline, after which fewer processes contend. Overlaps are checked
over every grant.
"""

from __future__ import annotations

import heapq
import math
import multiprocessing
import os
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .harness import (
    Case,
    Column,
    LockerFactory,
    Options,
    Row,
    Suite,
    add_suite,
    percentile,
    progress,
    us,
)

NAME = "contended"
#: Longest wait for every worker to be ready (spawn + Django setup + connect) or a round to end.
STARTUP_TIMEOUT = 120.0

Grant = tuple[int, int, int]  # (worker index, acquire-return ns, just-before-release ns)


@dataclass
class RoundResult:
    """One round's history: every worker's start time, grants and acquire timeouts."""

    starts: list[int]
    grants: list[Grant]
    timeouts: int


def _worker(
    factory: LockerFactory,
    key: str,
    index: int,
    rounds: int,
    duration_ns: int,
    hold_s: float,
    barrier: Any,
    results: Any,
) -> None:
    """A contending process: build a Locker, then run ``rounds`` timed loops."""
    locker = None
    try:
        locker = factory(key)
        if locker.acquire():  # open every connection before the clock starts
            locker.release()
        acquire, release = locker.acquire, locker.release
        clock, sleep = time.monotonic_ns, time.sleep
        for round_ in range(rounds):
            barrier.wait(STARTUP_TIMEOUT)
            start = clock()
            deadline = start + duration_ns
            grants: list[tuple[int, int]] = []
            timeouts = 0
            while clock() < deadline:
                if not acquire():
                    timeouts += 1
                    continue
                acquired = clock()
                if hold_s:
                    sleep(hold_s)
                releasing = clock()
                release()
                grants.append((acquired, releasing))
            results.put(("round", index, round_, start, grants, timeouts))
    except BaseException:
        results.put(("error", index, os.getpid(), traceback.format_exc()))
        barrier.abort()
    finally:
        if locker is not None:
            locker.close()


def run_processes(
    factory: LockerFactory, key: str, processes: int, rounds: int, duration: float, hold_ms: float
) -> list[RoundResult]:
    """Run ``processes`` workers on ``key`` for ``rounds`` rounds; return each round's history.

    :raises RuntimeError: with a worker's traceback when one fails.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes + 1)  # this process too: it knows when a round starts
    results = ctx.Queue()
    args = (int(duration * 1e9), hold_ms / 1000.0, barrier, results)
    workers = [
        ctx.Process(
            target=_worker,
            args=(factory, key, i, rounds, *args),
            name=f"bench-worker-{i}",
            daemon=True,
        )
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    history: list[RoundResult] = []
    try:
        for _ in range(rounds):
            try:
                barrier.wait(STARTUP_TIMEOUT)
            except threading.BrokenBarrierError:
                raise _worker_failure(results, "before a round started") from None
            got = [_get(results, duration + STARTUP_TIMEOUT) for _ in range(processes)]
            starts = [0] * processes
            grants: list[Grant] = []
            timeouts = 0
            for _, index, _round, start, worker_grants, worker_timeouts in got:
                starts[index] = start
                grants += [(index, a, r) for a, r in worker_grants]
                timeouts += worker_timeouts
            history.append(RoundResult(starts, grants, timeouts))
    finally:
        barrier.abort()  # frees any worker still waiting if we failed
        for worker in workers:
            worker.join(timeout=30)
        for worker in workers:
            if worker.is_alive():
                worker.terminate()  # only our own children, by handle
                worker.join(timeout=5)
    return history


def _get(results: Any, timeout: float) -> tuple[Any, ...]:
    try:
        message = results.get(timeout=timeout)
    except queue.Empty:
        raise RuntimeError(f"no result from the workers within {timeout:.0f} s") from None
    if message[0] == "error":
        raise RuntimeError(f"worker {message[1]} (pid {message[2]}) failed:\n{message[3]}")
    return message


def _worker_failure(results: Any, when: str) -> RuntimeError:
    try:
        message = results.get(timeout=5)
    except queue.Empty:
        return RuntimeError(f"a worker failed {when} and said nothing")
    if message[0] == "error":
        return RuntimeError(f"worker {message[1]} (pid {message[2]}) failed {when}:\n{message[3]}")
    return RuntimeError(f"the workers' barrier broke {when}")


# --------------------------------------------------------------------------- analysis


@dataclass
class Analysis:
    """What one round's history says."""

    grants: int  # in the steady-state window
    seconds: float  # length of that window
    handoffs: list[int]  # ns, one per grant in the window
    holds: list[int]  # ns, one per grant in the window: how long the sleep really held it
    self_handoffs: int  # of those, grants to the process that held the lock just before
    per_process: list[int]  # grants in the window per worker
    overlaps: int  # over every grant of the round
    timeouts: int


def analyse(
    result: RoundResult, duration: float, warmup: float, at_once: int = 1
) -> Analysis:
    """Merge a round's grants by acquire time and measure them (see the module docstring).

    ``at_once``: how many may hold together (a semaphore's limit); a grant while that
    many holds are open is an overlap. Handoffs are measured only when it is 1."""
    grants = sorted(result.grants, key=lambda g: g[1])
    window_start = max(result.starts) + int(warmup * 1e9)
    window_end = min(result.starts) + int(duration * 1e9)
    overlaps = 0
    open_until: list[int] = []  # a heap of the release times of the holds still open
    handoffs: list[int] = []
    holds: list[int] = []
    self_handoffs = 0
    per_process = [0] * len(result.starts)
    for i, (index, acquired, releasing) in enumerate(grants):
        while open_until and open_until[0] <= acquired:
            heapq.heappop(open_until)
        if len(open_until) >= at_once:
            overlaps += 1  # this hold began while the most allowed were still held
        heapq.heappush(open_until, releasing)
        if not window_start <= acquired <= window_end:
            continue
        per_process[index] += 1
        holds.append(releasing - acquired)
        if i > 0 and at_once == 1:
            previous = grants[i - 1]
            handoffs.append(acquired - previous[2])
            self_handoffs += previous[0] == index
    count = sum(per_process)
    seconds = max(window_end - window_start, 1) / 1e9
    return Analysis(
        count, seconds, handoffs, holds, self_handoffs, per_process, overlaps, result.timeouts
    )


def summarise(rounds: Sequence[Analysis]) -> dict[str, Any]:
    """Pool the rounds of one case into a table row's values."""
    handoffs = sorted(h for a in rounds for h in a.handoffs)
    holds = [h for a in rounds for h in a.holds]
    per_process = [sum(col) for col in zip(*(a.per_process for a in rounds), strict=True)]
    grants = sum(a.grants for a in rounds)
    rates = [a.grants / a.seconds for a in rounds]
    served = all(min(a.per_process) > 0 for a in rounds)
    mean = sum(per_process) / len(per_process)
    fair_min = min(per_process) / mean if mean else math.nan
    fair_max = max(per_process) / mean if mean else math.nan
    return {
        "grants": grants,
        "rate": grants / sum(a.seconds for a in rounds),
        "rate_spread": f"{min(rates):,.0f}..{max(rates):,.0f}",
        "handoff_p50": percentile(handoffs, 50),
        "handoff_p99": percentile(handoffs, 99),
        "hold_mean": sum(holds) / len(holds) if holds else math.nan,
        "self": 100.0 * sum(a.self_handoffs for a in rounds) / max(len(handoffs), 1),
        "fairness": f"{min(per_process)} / {max(per_process)}",
        "fair_min": fair_min,
        "fair_max": fair_max,
        "fair_spread": f"{fair_min:.2f} / {fair_max:.2f}",
        "served": "yes" if served else "**NO**",
        "per_process": " ".join(map(str, per_process)),
        "timeouts": sum(a.timeouts for a in rounds),
        "overlaps": sum(a.overlaps for a in rounds),
    }


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """Run every case with ``options.processes`` processes; return one row per case."""
    warmup = _warmup(options)
    rows = []
    for case in cases:
        progress(
            f"{NAME}: {case.name}, {options.processes} processes x {options.repeat} "
            f"round(s) x {options.duration:g} s"
        )
        history = run_processes(
            case.factory,
            f"bench:{NAME}:{case.name}",
            options.processes,
            options.repeat,
            options.duration,
            options.hold_ms,
        )
        analyses = [analyse(r, options.duration, warmup, case.at_once) for r in history]
        rows.append(Row(case, summarise(analyses)))
    return rows


def _warmup(options: Options) -> float:
    return min(0.5, options.duration / 5)


def _overlaps(value: Any) -> str:
    return str(value) if value == 0 else f"**{value}**"


def _notes(options: Options) -> str:
    return (
        f"{options.processes} OS processes (spawn) on one key, {options.repeat} round(s) x "
        f"{options.duration:g} s, hold {options.hold_ms:g} ms by `time.sleep`; stats over the "
        f"steady-state window (first {_warmup(options):g} s and the tail after the first "
        "process stops are left out; overlaps are checked over every grant). "
        "A semaphore's row (limit n) counts a grant as an overlap only while n holds are "
        "open, and has no handoff. "
        "handoff = previous holder's just-before-release → this grant's acquire-return "
        "(`CLOCK_MONOTONIC`, µs); hold = acquire-return → just-before-release (the sleep, "
        "as long as the OS made it); self = share of grants going to the process that held the "
        "lock just before; grants min / max per process, summed over rounds, and each over "
        "the mean of the processes; "
        "`x ref` = handoff p50 / the reference's."
    )


SUITE = add_suite(
    Suite(
        name=NAME,
        title="Contended: processes on one key, short holds",
        run=run,
        columns=(
            Column("grants", "grants"),
            Column("rate", "acq/s", lambda v: f"{v:,.0f}"),
            Column("rate_spread", "acq/s per round"),
            Column("handoff_p50", "handoff p50 µs", us),
            Column("handoff_p99", "handoff p99 µs", us),
            Column("hold_mean", "hold mean µs", us),
            Column("self", "self %", lambda v: f"{v:.0f}"),
            Column("fairness", "grants min / max"),
            Column("fair_spread", "min / max ÷ mean"),
            Column("served", "all served"),
            Column("per_process", "grants per process"),
            Column("timeouts", "timeouts"),
            Column("overlaps", "overlaps", _overlaps),
        ),
        ratio_metric="handoff_p50",
        notes=_notes,
    )
)
