"""``python -m benchmarks.celery_tasks``: what ``@distlock`` adds to a no-op Celery task.

End to end through a real worker: this process sends a task and waits for its
result (``delay().get()``), one at a time, to a ``celery worker`` it starts (prefork,
one child) with the Redis of ``DISTLOCK_REDIS_URL`` as broker and result store
(database 12). Per alias, rounds alternate a no-op task and the same no-op under
``@distlock``, and the same with a bare ``with locks[alias].lock(...)`` as its body
(so drift hits all three alike). The bar: the time ``@distlock`` adds (its p50 less
the plain task's) at most 1.5x what the lock's own acquire+release adds measured the
same way (the bare task's p50 less the plain task's).

Why that reference and not the pair timed in a tight loop (also printed, ``x loop``,
``harness.time_pairs`` in the worker's child): a task's first round trips after the
child waited for its message are slower than a hot loop's (measured on a shared
2-core machine: a raw Redis ``PING`` as a task's first call took 2.3x its second),
whoever makes them; the loop hides that, the bare task does not.

    . <servers dir>/env && python -m benchmarks.celery_tasks [--quick] [--smoke]

``--smoke`` sends each task once and times nothing (tests/test_benchmarks_smoke.py).
Settings: ``benchmarks.settings`` (its ``pg`` and ``redis`` aliases; the benchmark
database is created and migrated as ``benchmarks.pg`` does).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from celery import Celery

from django_distlock import distlock, locks

#: Aliases of benchmarks.settings measured, when their server is configured.
ALIASES = ("redis", "pg")
BAR = 1.5
NAME = "bench:celery"

app = Celery("benchmarks")
app.conf.update(
    broker_url=(
        urlsplit(os.environ["DISTLOCK_REDIS_URL"])._replace(path="/12").geturl()
        if os.environ.get("DISTLOCK_REDIS_URL") else None
    ),
    broker_connection_retry_on_startup=True,
    task_default_queue=f"bench-celery-{os.getpid()}",
    worker_hijack_root_logger=False,
)
app.conf.result_backend = app.conf.broker_url


@app.task(name="bench.noop")
def noop() -> None:
    """Nothing: the floor of a task's round trip."""


@app.task(name="bench.locked_redis")
@distlock(NAME, using="redis")
def locked_redis() -> None:
    """Nothing, under ``@distlock`` on the Redis alias."""


@app.task(name="bench.locked_pg")
@distlock(NAME, using="pg")
def locked_pg() -> None:
    """Nothing, under ``@distlock`` on the PostgreSQL lease alias."""


@app.task(name="bench.bare")
def bare(alias: str) -> None:
    """The lock's own acquire+release as the task's body, without the decorator."""
    with locks[alias].lock(NAME):
        pass


LOCKED = {"redis": locked_redis, "pg": locked_pg}


@app.task(name="bench.pairs")
def pairs(alias: str, iterations: int) -> list[int]:
    """The lock's own acquire+release, timed ``iterations`` times in the worker's child
    (the process the locked task runs in), after a tenth as many untimed; in ns."""
    from .harness import time_pairs

    acquired, released = time_pairs(_Pair(alias), iterations, max(iterations // 10, 1))
    return [a + r for a, r in zip(acquired, released, strict=True)]


class _Pair:
    """A :class:`benchmarks.harness.Locker` over ``locks[alias]``."""

    def __init__(self, alias: str) -> None:
        self.handle = locks[alias].lock(NAME)

    def acquire(self) -> bool:
        return self.handle.acquire()

    def release(self) -> None:
        self.handle.release()

    def close(self) -> None:
        locks.close_all()


def _round_trip(task: Any) -> int:
    started = time.perf_counter_ns()
    task.delay().get(timeout=30)
    return time.perf_counter_ns() - started


def measure(alias: str, tasks: int, pairs: int) -> dict[str, float]:
    """The p50s (ns) of a task's round trip (plain, under @distlock, with a bare
    acquire+release as its body) and of the lock's pair timed in a loop in the child."""
    from .harness import percentile

    kinds = {"plain": noop.delay, "locked": LOCKED[alias].delay,
             "bare": lambda: bare.delay(alias)}
    times: dict[str, list[int]] = {kind: [] for kind in kinds}
    for number in range(tasks + tasks // 10):  # a tenth untimed first: warm-up
        for kind, send in kinds.items():
            started = time.perf_counter_ns()
            send().get(timeout=30)
            if number >= tasks // 10:
                times[kind].append(time.perf_counter_ns() - started)
    loop = sorted(globals()["pairs"].delay(alias, pairs).get(timeout=120))
    return {**{kind: percentile(sorted(values), 50) for kind, values in times.items()},
            "loop": percentile(loop, 50), "n": float(tasks)}


def table(results: dict[str, dict[str, float]]) -> list[str]:
    """Markdown rows and the bar lines, as the harness prints them."""
    from .harness import ratio, us

    lines = [
        "### Celery: a no-op task, plain and under @distlock, through a real worker", "",
        "| alias | n | plain p50 µs | @distlock p50 µs | bare lock p50 µs | added by "
        "@distlock µs | added by bare lock µs | pair in a loop µs | x bare | x loop |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    bars = []
    for alias, row in results.items():
        added, bare_added = row["locked"] - row["plain"], row["bare"] - row["plain"]
        value, hot = added / bare_added, added / row["loop"]
        lines.append(
            f"| {alias} | {int(row['n'])} | {us(row['plain'])} | {us(row['locked'])} | "
            f"{us(row['bare'])} | {us(added)} | {us(bare_added)} | {us(row['loop'])} | "
            f"{ratio(value)} | {ratio(hot)} |"
        )
        bars.append(f"- `{alias}` added by @distlock / added by the bare acquire+release "
                    f"(p50, end to end): {ratio(value)} (bar <= {BAR:g}x: "
                    f"{'within' if value <= BAR else 'OVER'})")
        bars.append(f"- `{alias}` added by @distlock / the pair timed in a loop in the "
                    f"child (p50): {ratio(hot)} (no bar: a hot loop, see the module's doc)")
    return [*lines, "", *bars]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 1 when an alias' server is missing (its row left out)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.celery_tasks")
    parser.add_argument("--quick", action="store_true", help="fewer tasks (200 per kind)")
    parser.add_argument("--smoke", action="store_true", help="each task once, time nothing")
    parser.add_argument("--tasks", type=int, help="timed tasks per kind and alias (1000)")
    options = parser.parse_args(argv)
    import django

    django.setup()
    from django.conf import settings

    from django_distlock.contrib.celery.testing import CeleryWorkers

    from . import pg

    if not app.conf.broker_url:
        print("benchmarks.celery_tasks: DISTLOCK_REDIS_URL is not set (the broker)",
              file=sys.stderr)
        return 1
    aliases = [alias for alias in ALIASES if alias in settings.DISTLOCK]
    if "pg" in aliases:
        pg.setup()
    missing = len(aliases) < len(ALIASES)
    locks.close_all()  # nothing of this process' for the worker to inherit
    tasks = options.tasks or (200 if options.quick else 1000)
    with CeleryWorkers("benchmarks.celery_tasks", queue=app.conf.task_default_queue,
                       workers=1, concurrency=1, env={**os.environ}):
        if options.smoke:
            for alias in aliases:
                noop.delay().get(timeout=30)
                LOCKED[alias].delay().get(timeout=30)
            print(f"smoke: {', '.join(aliases)} ok")
            return 1 if missing else 0
        results = {alias: measure(alias, tasks, tasks) for alias in aliases}
    print("\n".join(table(results)))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
