"""Suite ``schedules``: the once-per-slot decision when 16 nodes fire one job at once.

Per case (one backend), :data:`NODES` OS processes are started with the
``spawn`` context; each sets Django up, decorates a no-op job with
:func:`~django_distlock.contrib.schedules.once_per_slot` (``max_hold`` 30 s,
``min_hold`` :data:`MIN_HOLD`) on the case's alias, and opens its connections
with one untimed acquire+release of a key of its own. Then, slot after slot,
they pass a barrier together and call the job at once: one wins and runs it
(keeping the lock for ``min_hold``: one more request, after the decision), the
others return without waiting. Between slots this process waits ``min_hold``
so that the next slot starts free.

Timed slots: ``perf_counter_ns`` from the call to the job's body starting (the
winner's decision) or to the call returning (a loser's whole cost). Traced
slots, after them (timing off): the requests each node sent to the lock server
during its call, counted in the calling thread with ``sys.setprofile``: socket
sends (Redis), psycopg ``Cursor.execute`` calls (PostgreSQL: one statement, one
round trip) and ``sqlite3`` cursor executes (SQLite: no server, but the same
count of statements). The bar: every loser returns within 2 round trips.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import sqlite3
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from types import FrameType
from typing import Any

from .harness import (
    Case,
    Column,
    Options,
    Row,
    Suite,
    add_bar,
    add_case,
    add_suite,
    percentile,
    progress,
    us,
)

NAME = "schedules"
#: Nodes firing the job at once.
NODES = 16
#: The lock is kept this long after a run: the next slot starts once it has passed.
MIN_HOLD = 0.2
#: Timed slots per ``--repeat`` round (``--quick``: 1 round), and traced slots after them.
TIMED_PER_ROUND, TRACED = 4, 2
STARTUP_TIMEOUT = 120.0
SENDS = {"send", "sendall", "sendmsg", "sendto"}


class Trips:
    """A profile hook counting the requests sent to a lock server (see the module)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            name = getattr(arg, "__name__", "")
            owner = getattr(arg, "__self__", None)
            sent = name in SENDS and "socket" in type(owner).__name__.lower()
            if sent or (name == "execute" and isinstance(owner, sqlite3.Cursor)):
                self.count += 1
        elif event == "call" and frame.f_code.co_name == "execute":
            self.count += frame.f_code.co_filename.endswith(os.path.join("psycopg", "cursor.py"))


def _node(alias: str, name: str, index: int, slots: tuple[int, int], barrier: Any,
          results: Any) -> None:
    """One node: fire the job ``sum(slots)`` times in step with the others."""
    try:
        import django

        django.setup()
        from django_distlock import locks
        from django_distlock.contrib.schedules import once_per_slot

        started: list[int] = []

        def body() -> bool:
            started.append(time.perf_counter_ns())
            return True

        job = once_per_slot(name, using=alias, max_hold=30, min_hold=MIN_HOLD)(body)
        warm = locks[alias].lock(f"{name}:warm:{index}", ttl=30)
        if warm.acquire():  # open every connection before the clock starts
            warm.release()
        timed, traced = slots
        for slot in range(timed + traced):
            trips = Trips() if slot >= timed else None
            barrier.wait(STARTUP_TIMEOUT)
            started.clear()
            if trips is not None:
                sys.setprofile(trips)
            begin = time.perf_counter_ns()
            won = job() is not None
            end = time.perf_counter_ns()
            sys.setprofile(None)
            took = (started[0] if won else end) - begin
            results.put(("slot", index, slot, won, took, None if trips is None else trips.count))
    except BaseException:
        results.put(("error", index, -1, False, 0, traceback.format_exc()))
        barrier.abort()


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """Fire every case's job from :data:`NODES` processes; one row per case."""
    return [_run_case(case, _slots(options)) for case in cases]


def _slots(options: Options) -> tuple[int, int]:
    return TIMED_PER_ROUND * options.repeat, TRACED


def _run_case(case: Case, slots: tuple[int, int]) -> Row:
    alias = case.factory.args[0]  # type: ignore[attr-defined]
    name = f"bench:{NAME}:{case.name}:{os.getpid()}:{time.time_ns()}"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(NODES + 1)
    results = ctx.Queue()
    nodes = [
        ctx.Process(target=_node, args=(alias, name, i, slots, barrier, results), daemon=True)
        for i in range(NODES)
    ]
    for node in nodes:
        node.start()
    got: list[tuple[Any, ...]] = []
    try:
        for slot in range(sum(slots)):
            progress(f"{NAME}: {case.name}, slot {slot + 1}/{sum(slots)}")
            try:
                barrier.wait(STARTUP_TIMEOUT)
            except threading.BrokenBarrierError:
                raise RuntimeError(_failure(results)) from None
            fired = [results.get(timeout=STARTUP_TIMEOUT) for _ in range(NODES)]
            errors = [entry[5] for entry in fired if entry[0] == "error"]
            if errors:
                raise RuntimeError(errors[0])
            got += fired
            time.sleep(MIN_HOLD * 1.5)  # the kept lock ends before the next slot
    finally:
        for node in nodes:
            node.join(10)
            if node.is_alive():
                node.kill()
    return Row(case, _figures(got, slots))


def _failure(results: Any) -> str:
    while True:
        entry = results.get(timeout=STARTUP_TIMEOUT)
        if entry[0] == "error":
            return str(entry[5])


def _figures(got: list[tuple[Any, ...]], slots: tuple[int, int]) -> dict[str, Any]:
    runs = [sum(1 for e in got if e[2] == slot and e[3]) for slot in range(sum(slots))]
    winners = sorted(e[4] for e in got if e[3] and e[5] is None)
    losers = sorted(e[4] for e in got if not e[3] and e[5] is None)
    loser_trips = [e[5] for e in got if not e[3] and e[5] is not None]
    winner_trips = [e[5] for e in got if e[3] and e[5] is not None]
    return {
        "slots": f"{slots[0]} + {slots[1]}",
        "runs": f"{min(runs)}..{max(runs)}",
        "winner_p50": percentile(winners, 50),
        "loser_p50": percentile(losers, 50),
        "loser_p99": percentile(losers, 99),
        "loser_max": losers[-1] if losers else math.nan,
        "loser_trips": max(loser_trips) if loser_trips else math.nan,
        "winner_trips": max(winner_trips) if winner_trips else math.nan,
    }


def _alias(alias: str, key: str) -> Any:
    """The case factory's stand-in: a case here is an alias (``factory.args[0]``)."""
    raise TypeError(f"{NAME} cases fire processes, they build no Locker ({alias}, {key})")


def smoke(case: Case) -> None:
    """``--smoke``: two calls of a no-op job in this process: one run, one skip.

    :raises AssertionError: when the first call did not run it or the second did.
    """
    from django_distlock.contrib.schedules import once_per_slot

    alias = case.factory.args[0]  # type: ignore[attr-defined]
    job = once_per_slot(f"bench:smoke:{NAME}:{case.name}:{time.time_ns()}", using=alias,
                        max_hold=30, min_hold=1)(lambda: True)
    if job() is not True or job() is not None:
        raise AssertionError(f"{case.name}: the job did not run once in its slot")


def setup() -> None:
    """Migrate the SQLite database; set PostgreSQL and Redis up as their own modules do
    (the rows of a server whose variable is unset were not registered).

    :raises SystemExit: when a configured server is not on 127.0.0.1.
    """
    from django.core.management import call_command

    from . import pg, redis

    if os.environ.get("DISTLOCK_PG_PORT"):
        pg.setup()
    if os.environ.get("DISTLOCK_REDIS_URL"):
        redis.setup()
    call_command("migrate", database="sqlite", verbosity=0, interactive=False)


def describe() -> str:
    """The servers, as the machine line shows them (SQLite's library version)."""
    return f"SQLite {sqlite3.sqlite_version}"


def _notes(options: Options) -> str:
    slots = _slots(options)
    return (
        f"{NODES} processes fire one `once_per_slot` job (min_hold {MIN_HOLD:g} s) at once "
        f"after a barrier, {slots[0]} timed slots then {slots[1]} traced; runs = nodes that "
        "ran it per slot (must be 1..1). Winner: call to the job's start; loser: the whole "
        "call. Round trips: requests a node sent during its call (socket sends, psycopg "
        "executes, sqlite3 executes), the most of any node."
    )


add_suite(
    Suite(
        name=NAME,
        title=f"Once per slot: {NODES} nodes fire one job at once",
        run=run,
        columns=(
            Column("slots", "slots"),
            Column("runs", "runs/slot"),
            Column("winner_p50", "winner p50 µs", us),
            Column("loser_p50", "loser p50 µs", us),
            Column("loser_p99", "loser p99 µs", us),
            Column("loser_max", "loser max µs", us),
            Column("loser_trips", "loser round trips", lambda v: f"{v:g}"),
            Column("winner_trips", "winner round trips", lambda v: f"{v:g}"),
        ),
        ratio_metric="loser_p50",
        notes=_notes,
        smoke=smoke,
    )
)

_CASES = [("sqlite.once-per-slot", "sqlite-lease", "database lease on SQLite", "", "sqlite")]
if os.environ.get("DISTLOCK_PG_PORT"):
    _CASES.append(("pg.once-per-slot", "pg", "database lease on PostgreSQL", "", "pg"))
if os.environ.get("DISTLOCK_REDIS_URL"):
    _CASES.append(("redis.once-per-slot", "redis", "Redis", "", "redis"))
for _name, _alias_name, _what, _, _group in _CASES:
    add_case(NAME, _name, functools.partial(_alias, _alias_name), _what, group=_group)
    add_bar(NAME, _name, None, 2, "loser_trips")
