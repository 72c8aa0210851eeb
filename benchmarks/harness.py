"""The harness: a registry of cases grouped in suites, statistics, and markdown tables.

A *case* is a factory that builds a :class:`Locker` (one client of one lock
implementation) for a key. A *suite* runs its cases and returns one
:class:`Row` per case; the harness prints a suite as one table. Modules that
add cases (``benchmarks.pg``, ``benchmarks.redis``, ...) call
:func:`add_case` at import and say which rows are *references*: each
reference adds a ``x name`` column whose values are every row's
:attr:`Suite.ratio_metric` divided by that reference's, within the same
``group`` (one server), measured in the same run. :func:`add_bar` names a
ratio the project promises; it is printed with its bar, never asserted. A
bar may divide by a row of a suite run earlier in the same run (a :class:`Ref`:
a handoff counted in round trips of the uncontended suite's ``PING``), or by a
value derived from one (an ideal rate), or compare a metric that is a ratio
already with its bar.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import time
import timeit
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class Locker(Protocol):
    """One client of a lock, built in the process that uses it."""

    def acquire(self) -> bool:
        """Take the lock (blocking, with the case's timeout); False if not had."""

    def release(self) -> None:
        """Give the lock back."""

    def close(self) -> None:
        """Close the connections this client opened."""


class AsyncLocker(Locker, Protocol):
    """A Locker that asyncio tasks can use too (suite ``asyncio``)."""

    async def aacquire(self) -> bool:
        """:meth:`acquire` for a task: waits never block the event loop."""

    async def arelease(self) -> None:
        """:meth:`release` for a task."""


#: Builds a Locker for a key. Must be picklable (a module-level callable or a
#: functools.partial of one) so the contended suite can send it to its processes.
LockerFactory = Callable[[str], Locker]


class Unavailable(Exception):
    """A case module cannot run here (its server is not configured); says why."""


@dataclass(frozen=True)
class Options:
    """What the command line chose; every suite reads what it needs."""

    repeat: int  # rounds of every case, interleaved where the suite can
    iterations: int  # timed acquire+release pairs per case per round (uncontended)
    warmup: int  # untimed pairs before each round's timed ones
    processes: int  # OS processes on one key (contended)
    hold_ms: float  # how long a contended holder keeps the lock (sleep)
    duration: float  # seconds each contended round lasts
    processes_list: tuple[int, ...] = (4, 16, 64)  # client processes per cell (scale.*)
    quick: bool = False  # --quick: the scale suites' cells last 1 s instead of 3


@dataclass(frozen=True)
class Case:
    """One row of a suite: a named lock implementation and what it measures."""

    suite: str
    name: str
    factory: LockerFactory
    what: str  # one line for the table
    group: str  # the server; ratios compare rows of one group
    reference: str | None = None  # the ratio column this row anchors, if any
    module: str = ""  # the module that registered it (a missing server drops its rows)
    at_once: int = 1  # holders allowed together (a semaphore's limit); more is an overlap


@dataclass(frozen=True)
class Ref:
    """What a bar divides by: ``metric`` of the row ``case`` of ``suite`` in this run
    (None: the bar's own suite and metric), turned first, if given, by
    ``derive(value, numerator_row, options)`` into another quantity (then ``label``
    names it in the printed line)."""

    case: str
    suite: str | None = None
    metric: str | None = None
    derive: Callable[[float, Row, Options], float] | None = None
    label: str | None = None


@dataclass(frozen=True)
class Bar:
    """A promised ratio: ``numerator``'s metric over ``denominator`` (None: the metric is
    a ratio already), at most ``limit`` (``at_least``: at least ``limit``)."""

    suite: str
    numerator: str
    denominator: Ref | None
    limit: float | None
    metric: str
    at_least: bool = False


@dataclass
class Row:
    """One case's results: metric name -> value (numbers in the suite's units, or text)."""

    case: Case
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Column:
    """A table column: the metric it shows, its header, and how a value is printed."""

    key: str
    title: str
    fmt: Callable[[Any], str] = str


@dataclass(frozen=True)
class Suite:
    """A group of cases run one way and printed as one table."""

    name: str
    title: str
    run: Callable[[Sequence[Case], Options], list[Row]]
    columns: tuple[Column, ...]
    ratio_metric: str  # what the ``x reference`` columns divide
    notes: Callable[[Options], str]  # how it was measured, printed under the title
    #: ``--smoke``: build a case's client and use it once, raising when that fails
    #: (None: :func:`smoke_locker`, one acquire+release of a Locker).
    smoke: Callable[[Case], None] | None = None


SUITES: dict[str, Suite] = {}
CASES: list[Case] = []
BARS: list[Bar] = []


def add_suite(suite: Suite) -> Suite:
    """Register a suite (its name is what ``--suite`` selects)."""
    SUITES[suite.name] = suite
    return suite


def add_case(
    suite: str,
    name: str,
    factory: LockerFactory,
    what: str,
    *,
    group: str,
    reference: str | None = None,
    at_once: int = 1,
) -> None:
    """Register a case of ``suite``; ``reference`` makes it anchor a ``x reference`` column;
    ``at_once``: how many may hold together (a semaphore's limit; contended suite)."""
    module = getattr(factory, "func", factory).__module__  # a functools.partial has .func
    CASES.append(Case(suite, name, factory, what, group, reference, module, at_once))


def add_bar(
    suite: str,
    numerator: str,
    denominator: str | Ref | None,
    limit: float | None,
    metric: str | None = None,
    *,
    at_least: bool = False,
) -> None:
    """Register a ratio to print under ``suite``'s table (default metric: its ratio metric).

    ``denominator``: a case of ``suite`` (same metric), a :class:`Ref`, or None when
    ``metric`` is a ratio already. ``at_least``: ``limit`` is a floor, not a ceiling.
    """
    ref = Ref(denominator) if isinstance(denominator, str) else denominator
    metric = metric or SUITES[suite].ratio_metric
    BARS.append(Bar(suite, numerator, ref, limit, metric, at_least))


def smoke_locker(case: Case) -> None:
    """Build ``case``'s Locker on a key of its own, acquire and release it once, close it.

    :raises NotAcquired: when the free key is not acquired.
    """
    locker = case.factory(f"bench:smoke:{case.suite}:{case.name}")
    try:
        if not locker.acquire():
            raise NotAcquired(f"{case.suite} {case.name}: a free key was not acquired")
        locker.release()
    finally:
        locker.close()


# --------------------------------------------------------------------------- statistics


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted values, linearly interpolated; NaN if none."""
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def us(ns: float) -> str:
    """Format nanoseconds as microseconds."""
    return "n/a" if math.isnan(ns) else f"{ns / 1000:,.1f}"


def ms(ns: float) -> str:
    """Format nanoseconds as milliseconds."""
    return "n/a" if math.isnan(ns) else f"{ns / 1e6:,.2f}"


def ratio(value: float) -> str:
    """Format a ratio as ``1.23x``."""
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def spread_us(values: Sequence[float]) -> str:
    """Format min-max of per-round values (nanoseconds) as microseconds."""
    return f"{us(min(values))}..{us(max(values))}" if values else "n/a"


# --------------------------------------------------------------------------- the timing loop


class NotAcquired(RuntimeError):
    """An uncontended acquire returned False: the setup, not the timing, is wrong."""


def time_pairs(locker: Locker, iterations: int, warmup: int) -> tuple[list[int], list[int]]:
    """Time ``iterations`` acquire+release pairs after ``warmup`` untimed ones.

    Returns the acquire and the release durations (ns, ``perf_counter_ns``).
    The garbage collector is off while timing, as ``timeit`` does.
    """
    import gc

    acquire, release, clock = locker.acquire, locker.release, time.perf_counter_ns
    for _ in range(warmup):
        if not acquire():
            raise NotAcquired(f"{locker!r} did not acquire an uncontended lock")
        release()
    acquired = [0] * iterations
    released = [0] * iterations
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for i in range(iterations):
            t0 = clock()
            ok = acquire()
            t1 = clock()
            release()
            t2 = clock()
            if not ok:
                raise NotAcquired(f"{locker!r} did not acquire an uncontended lock")
            acquired[i] = t1 - t0
            released[i] = t2 - t1
    finally:
        if gc_was_on:
            gc.enable()
    return acquired, released


# --------------------------------------------------------------------------- tables


def render(
    suite: Suite,
    rows: Sequence[Row],
    options: Options,
    earlier: Mapping[str, Sequence[Row]] | None = None,
) -> str:
    """The suite as markdown: title, how it was measured, the table, its bars.

    ``earlier``: the rows of the suites already run in this run, by suite name (what
    a bar's :class:`Ref` to another suite reads).
    """
    refs: list[str] = []
    for row in rows:
        if row.case.reference and row.case.reference not in refs:
            refs.append(row.case.reference)
    anchor = {(r.case.group, r.case.reference): r for r in rows if r.case.reference}
    header = ["case", "what", *(c.title for c in suite.columns), *(f"x {ref}" for ref in refs)]
    lines = [f"### {suite.title}", "", suite.notes(options), ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    for row in rows:
        cells = [f"`{row.case.name}`", row.case.what]
        cells += [c.fmt(row.values.get(c.key, math.nan)) for c in suite.columns]
        for ref in refs:
            base = anchor.get((row.case.group, ref))
            cells.append(ratio(_divide(row, base, suite.ratio_metric)) if base else "")
        lines.append("| " + " | ".join(cells) + " |")
    runs = {**(earlier or {}), suite.name: rows}
    bars = [b for b in BARS if b.suite == suite.name]
    if bars:
        lines.append("")
    for bar in bars:
        line = _bar_line(bar, runs, options)
        if line:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _bar_line(bar: Bar, runs: Mapping[str, Sequence[Row]], options: Options) -> str | None:
    """A bar as a list item; None when its rows are not in this run (a module skipped)."""
    num = _row(runs[bar.suite], bar.numerator)
    if num is None:
        return None
    ref = bar.denominator
    if ref is None:
        what, value = f"`{bar.numerator}` ({bar.metric})", num.values.get(bar.metric, math.nan)
    else:
        ref_suite, ref_metric = ref.suite or bar.suite, ref.metric or bar.metric
        if ref.label:
            what = f"`{bar.numerator}` ({bar.metric}) / {ref.label}"
        elif ref.suite or ref.metric:
            what = f"`{bar.numerator}` / `{ref.case}` ({bar.metric} / {ref_suite} {ref_metric})"
        else:
            what = f"`{bar.numerator}` / `{ref.case}` ({bar.metric})"
        if ref_suite not in runs:
            return f"- {what}: n/a (needs suite `{ref_suite}` in the same run)"
        den = _row(runs[ref_suite], ref.case)
        if den is None:
            return None
        base = den.values.get(ref_metric, math.nan)
        if ref.derive is not None:
            base = ref.derive(base, num, options)
        value = _quotient(num.values.get(bar.metric, math.nan), base)
    verdict = ""
    if bar.limit is not None and not math.isnan(value):
        if bar.at_least:
            verdict = f" (bar >= {bar.limit:g}x: {'within' if value >= bar.limit else 'UNDER'})"
        else:
            verdict = f" (bar <= {bar.limit:g}x: {'within' if value <= bar.limit else 'OVER'})"
    return f"- {what}: {ratio(value)}{verdict}"


def _row(rows: Sequence[Row], case: str) -> Row | None:
    return next((row for row in rows if row.case.name == case), None)


def _divide(row: Row, base: Row | None, metric: str) -> float:
    if base is None:
        return math.nan
    return _quotient(row.values.get(metric, math.nan), base.values.get(metric, math.nan))


def _quotient(num: float, den: float) -> float:
    return num / den if den and not math.isnan(den) else math.nan


def machine_line(servers: Sequence[str]) -> str:
    """One line saying where and with what the numbers were measured."""
    import django

    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    parts = [
        f"{cpus} CPUs ({usable} usable, {_cpu_model()})",
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"Python {platform.python_version()} ({_call_ns():.0f} ns an empty call)",
        f"Django {django.get_version()}",
        *servers,
        f"git {_git_revision()}",
        time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    ]
    return "**Machine:** " + "; ".join(parts)


def _call_ns() -> float:
    """One empty Python function call on this host now, in nanoseconds (best of five runs):
    how fast the host runs a client's Python, which moves a lock's ratio to raw round
    trips as much as its code does (docs/benchmarks.md, "Reading a ratio")."""

    def nothing() -> None:
        return None

    return min(timeit.repeat(nothing, number=100_000, repeat=5)) / 100_000 * 1e9


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def progress(message: str) -> None:
    """A progress line on stderr (stdout carries only the tables)."""
    print(f"[benchmarks] {message}", file=sys.stderr, flush=True)
