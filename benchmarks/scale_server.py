"""Suite ``scale.server``: what one uncontended acquire+release pair and one held lock cost
the server, read from the server's own accounting, side by side with the peers.

``--suite scale.server`` runs four tables, one per server (``scale.server.redis``,
``.pg``, ``.zookeeper``, ``.memcached``; their cases live in
``benchmarks/scale_server_<server>.py``). Per case, one process, one client:

1. **held**: ``--iterations`` locks (2,000; ``--quick`` 500) acquired on distinct names
   (``scale:<case>:h:<i>``) and held together; the server's memory (or rows, znodes) is
   read before (until it holds still, see :func:`settle`) and while they are held, then
   everything is released and it is read again: what a held lock costs, and what an idle
   name leaves behind. This comes first, so that nothing the pairs leave to expire (a
   peer's signal list, an empty container node) goes away under these reads;
2. **pairs**: ``--iterations`` acquire+release pairs, each on a name of its own
   (``scale:<case>:p:<i>``), after 20 untimed ones; the server's counters are read just
   before and just after, and the deltas divided by the pairs.

Bigger sizes: ``--iterations 20000`` (pairs and held locks alike). The counters are
server-wide: the run must be alone on its servers (``flock /work/bench.lock``, or
``scripts/bench``'s private servers); nothing here resets a counter (every figure is a
difference of two reads). Every name starts with ``scale:``; what a run leaves is
deleted at its start and end. Benchmarks assert nothing: the bars are printed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from .harness import (
    Case,
    Column,
    LockerFactory,
    NotAcquired,
    Options,
    Row,
    Suite,
    add_case,
    add_suite,
)

NAME = "scale.server"
#: Untimed pairs before the counted ones (connections opened, scripts loaded).
WARMUP = 20
#: Reads of a memory figure, and the pause between two (see :func:`settle`).
READS, READ_PAUSE, STILL = 5, 0.1, 256


class Handle(Protocol):
    """One lock of one name."""

    def acquire(self) -> bool:
        """Take it (blocking, 5 s timeout); False if not had."""

    def release(self) -> None:
        """Give it back."""


class Client(Protocol):
    """One case's client: it builds a handle per acquisition, as user code does."""

    def lock(self, name: str) -> Handle:
        """A new lock object for ``name``."""

    def close(self) -> None:
        """Close the connections this client opened."""


class DistLockClient:
    """django-distlock through its public API: ``locks[alias].lock(name, ttl=30,
    timeout=5)``, a new handle per acquisition."""

    def __init__(self, alias: str) -> None:
        from .lockers import django_setup

        django_setup()
        from django_distlock import locks

        self.locks, self.alias = locks, alias

    def lock(self, name: str) -> Handle:
        from .lockers import TTL

        return self.locks[self.alias].lock(name, ttl=TTL, timeout=5)

    def close(self) -> None:
        from django.db import connections

        self.locks.close_all()
        connections.close_all()


def add(suite: str, name: str, factory: Callable[[], Client], what: str, *, group: str,
        reference: str | None = None) -> None:
    """Register a case of one of this family's suites (``factory()`` builds its client)."""
    add_case(suite, name, cast(LockerFactory, factory), what, group=group, reference=reference)


def client_of(case: Case) -> Client:
    """Build ``case``'s client."""
    return cast(Callable[[], Client], case.factory)()


def pairs(client: Client, prefix: str, count: int) -> float:
    """Run ``count`` acquire+release pairs on ``prefix:<i>``; return the wall seconds."""
    start = time.perf_counter()
    for i in range(count):
        handle = client.lock(f"{prefix}:{i}")
        if not handle.acquire():
            raise NotAcquired(f"{prefix}:{i} was not acquired")
        handle.release()
    return time.perf_counter() - start


def hold(client: Client, prefix: str, count: int) -> list[Handle]:
    """Acquire ``count`` locks on ``prefix:<i>`` and keep them held; return their handles."""
    held = []
    try:
        for i in range(count):
            handle = client.lock(f"{prefix}:{i}")
            if not handle.acquire():
                raise NotAcquired(f"{prefix}:{i} was not acquired")
            held.append(handle)
    except BaseException:
        release_all(held)
        raise
    return held


def release_all(held: Sequence[Handle]) -> None:
    """Release held handles, the last taken first (transaction mode nests them)."""
    for handle in reversed(held):
        handle.release()


def settle(read: Callable[[], float], reads: int = READS) -> float:
    """A memory figure once it holds still: read every ``READ_PAUSE`` s until ``reads``
    reads in a row lie within ``STILL`` bytes (the server shrinks, grows and rehashes its
    key tables in the background), at most ``reads`` x 6 reads; the last read."""
    values = [read()]
    for _ in range(max(reads * 6 - 1, 0)):
        tail = values[-reads:]
        if len(tail) == reads and max(tail) - min(tail) < STILL:
            break
        time.sleep(READ_PAUSE)
        values.append(read())
    return values[-1]


def per(value: float, count: int) -> float:
    """``value / count``, NaN for no count."""
    return value / count if count else math.nan


def fmt(digits: int) -> Callable[[Any], str]:
    """A column format with ``digits`` decimals (``n/a`` for NaN, text as is)."""

    def show(value: Any) -> str:
        if isinstance(value, str):
            return value
        return "n/a" if value is None or math.isnan(value) else f"{value:,.{digits}f}"

    return show


def ratio_column(rows: Sequence[Row], metric: str, reference: str, key: str) -> None:
    """Store in each row, under ``key``, its ``metric`` over the row ``reference``'s (same
    group), for a second ratio the harness's single ``x ref`` metric does not print."""
    base = {r.case.group: r.values.get(metric, math.nan) for r in rows if r.case.name == reference}
    for row in rows:
        den = base.get(row.case.group, math.nan)
        num = row.values.get(metric, math.nan)
        row.values[key] = num / den if den and not math.isnan(den) else math.nan


def register(
    server: str,
    title: str,
    measure: Callable[[Case, int, bool], dict[str, float]],
    columns: tuple[Column, ...],
    ratio_metric: str,
    notes: str,
    finish: Callable[[list[Row]], None] | None = None,
) -> str:
    """Register the suite ``scale.server.<server>``; return its name.

    ``measure(case, count, settled)`` gives a row's values (``settled``: False in a smoke
    run, where the counters' slow settling is skipped); ``finish(rows)`` adds values that
    compare rows.
    """
    name = f"{NAME}.{server}"

    def run(cases: Sequence[Case], options: Options) -> list[Row]:
        from .harness import progress

        rows = []
        for case in cases:
            progress(f"{name}: {case.name}, {options.iterations} pairs and held locks")
            rows.append(Row(case, measure(case, options.iterations, True)))
        if finish:
            finish(rows)
        return rows

    def smoke(case: Case) -> None:
        measure(case, 2, False)

    def describe(options: Options) -> str:
        return (
            f"One process, one client per case: {options.iterations} locks held together and "
            f"released, then {options.iterations} acquire+release pairs on distinct names "
            f"(after {WARMUP}). " + notes
        )

    add_suite(Suite(name, title, run, columns, ratio_metric, describe, smoke))
    return name
