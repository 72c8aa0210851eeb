"""Suite ``asyncio``'s analysis: one round's history as the processes report it, and
what it says (grants, handoffs, overlaps, the loop's lag), pooled into a table row.

The measuring is :mod:`benchmarks.asyncio_contended`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .harness import ms, percentile, us

#: The issue's bar on the loop lag's p99.
LAG_BAR_MS = 5.0
#: The metric of the bar line: the loop lag's p99 over :data:`LAG_BAR_MS` (at most 1x).
LAG_METRIC = f"loop lag p99 / {LAG_BAR_MS:g} ms"

TaskReport = tuple[int, list[tuple[int, int]], list[int], int]  # key, grants, waits, timeouts


@dataclass
class RoundResult:
    """One round's history, as the processes reported it."""

    start: int  # the tasks' round start, ns
    deadline: int  # no task starts an acquire after it
    per_task: list[TaskReport]
    lags: list[tuple[int, int]]  # per tick: ns since the start, ns late
    thread_starts: list[int]
    #: per thread process: (key, acquired, releasing)
    thread_grants: list[list[tuple[int, int, int]]]
    thread_timeouts: int



@dataclass
class Analysis:
    """What one round's history says."""

    tasks: int
    served: int  # tasks with at least one grant
    first_grants: list[int]  # ns from the round's start to each served task's first grant
    waits: list[int]  # ns, every granted aacquire()
    task_timeouts: int
    thread_timeouts: int
    task_grants: int  # in the window
    thread_grants: list[int]  # in the window, per thread process
    task_handoffs: list[int]  # ns, grants to tasks in the window
    thread_handoffs: list[int]  # ns, grants to threads in the window
    overlaps: int  # over every grant of the round
    seconds: float  # length of the window
    lags: list[int]  # ns late, per tick
    worst_lag: tuple[int, int]  # (ns late, ns since the round's start) of the latest tick


def analyse(result: RoundResult, warmup: float) -> Analysis:
    """Merge the round's grants per key and measure them (see the module docstring)."""
    window_start = max([result.start, *result.thread_starts]) + int(warmup * 1e9)
    window_end = result.deadline
    history: dict[int, list[tuple[int, int, int]]] = {}  # key -> (acquired, releasing, who)
    for key, grants, _, _ in result.per_task:
        history.setdefault(key, []).extend((a, r, -1) for a, r in grants)
    for who, grants in enumerate(result.thread_grants):
        for key, a, r in grants:
            history.setdefault(key, []).append((a, r, who))
    overlaps = task_grants = 0
    thread_grants = [0] * len(result.thread_grants)
    task_handoffs: list[int] = []
    thread_handoffs: list[int] = []
    for grants in history.values():
        grants.sort()
        latest_release = -math.inf
        for i, (acquired, releasing, who) in enumerate(grants):
            if acquired < latest_release:
                overlaps += 1  # this hold began before an earlier one on its key ended
            latest_release = max(latest_release, releasing)
            if not window_start <= acquired <= window_end:
                continue
            if who < 0:
                task_grants += 1
            else:
                thread_grants[who] += 1
            if i > 0:
                handoff = acquired - grants[i - 1][1]
                (task_handoffs if who < 0 else thread_handoffs).append(handoff)
    served = [grants for _, grants, _, _ in result.per_task if grants]
    return Analysis(
        tasks=len(result.per_task),
        served=len(served),
        first_grants=[grants[0][0] - result.start for grants in served],
        waits=[w for _, _, waits, _ in result.per_task for w in waits],
        task_timeouts=sum(t for _, _, _, t in result.per_task),
        thread_timeouts=result.thread_timeouts,
        task_grants=task_grants,
        thread_grants=thread_grants,
        task_handoffs=task_handoffs,
        thread_handoffs=thread_handoffs,
        overlaps=overlaps,
        seconds=max(window_end - window_start, 1) / 1e9,
        lags=[late for _, late in result.lags],
        worst_lag=max(((late, at) for at, late in result.lags), default=(0, 0)),
    )


def summarise(rounds: Sequence[Analysis]) -> dict[str, Any]:
    """Pool the rounds of one case into a table row's values."""

    def pooled(attr: str) -> list[int]:
        return sorted(x for a in rounds for x in getattr(a, attr))

    first, waits, lags = pooled("first_grants"), pooled("waits"), pooled("lags")
    task_handoffs, thread_handoffs = pooled("task_handoffs"), pooled("thread_handoffs")
    tasks, served = sum(a.tasks for a in rounds), sum(a.served for a in rounds)
    per_thread = [sum(col) for col in zip(*(a.thread_grants for a in rounds), strict=True)]
    task_grants = sum(a.task_grants for a in rounds)
    mean_thread = sum(per_thread) / max(len(per_thread), 1)
    lag_p99 = percentile(lags, 99)
    return {
        "served": f"{served} / {tasks}",
        "all_served": "yes" if served == tasks else "**NO**",
        "timeouts": f"{sum(a.task_timeouts for a in rounds)} / "
        f"{sum(a.thread_timeouts for a in rounds)}",
        "task_grants": task_grants,
        "thread_grants": " ".join(map(str, per_thread)),
        "share": task_grants / mean_thread if mean_thread else math.nan,
        "rate": (task_grants + sum(per_thread)) / sum(a.seconds for a in rounds),
        "first": _triple(first, ms),
        "wait": f"{ms(percentile(waits, 50))} / {ms(percentile(waits, 99))}",
        "handoff_p50": percentile(task_handoffs, 50),
        "handoff": f"{us(percentile(task_handoffs, 50))} / {us(percentile(task_handoffs, 99))}",
        "thread_handoff": f"{us(percentile(thread_handoffs, 50))} / "
        f"{us(percentile(thread_handoffs, 99))}",
        "lag": _triple(lags, ms),
        "worst_lag_at": f"+{max(a.worst_lag for a in rounds)[1] / 1e6:,.0f} ms",
        "lag_ok": "n/a"
        if math.isnan(lag_p99)
        else ("yes" if lag_p99 < LAG_BAR_MS * 1e6 else "**NO**"),
        LAG_METRIC: lag_p99 / (LAG_BAR_MS * 1e6),
        "overlaps": sum(a.overlaps for a in rounds),
    }


def _triple(ordered: list[int], fmt: Any) -> str:
    """p50 / p99 / max of sorted values."""
    top = ordered[-1] if ordered else math.nan
    return f"{fmt(percentile(ordered, 50))} / {fmt(percentile(ordered, 99))} / {fmt(top)}"
