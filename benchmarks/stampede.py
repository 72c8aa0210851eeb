"""Suite ``stampede``: 16 processes read one hot key that expires every second.

Issue 36's measurement, seed 003's story: a cached value that takes :data:`BUILD`
seconds to compute (the "database query", a sleep) stays fresh :data:`FRESH` s;
:data:`PROCESSES` OS processes (``spawn``) call the case's get-or-set on it in a
loop for ``--duration`` seconds per round, on the same Redis (django-redis), and
record each call's latency (``perf_counter_ns``) and each build's start and end
(``CLOCK_MONOTONIC``, system-wide).

Figures: calls; builds, and builds per expiry (the window over :data:`FRESH`);
``overlap``, the most builds running at once (1: one per expiry); p50 and p99 of
every call; p99 of the calls that began while another process was building (what a
reader waits during a rebuild). The ``plain`` row is ``cache.get()`` of a key
that never expires: the floor every ratio divides by.

Cases: ``plain``; Django's ``cache.get_or_set()`` (no lock); dogpile.cache's region
on Redis with ``distributed_lock`` (an expired value is served while one process
regenerates); django-cacheops' ``cached_as(lock=True)`` (its own settings module: a
lock key in the cache, waiters woken through a signal list); each peer if installed;
and ``django_distlock.caching``'s ``get_or_set`` on the ``redis`` alias, without and
with ``stale`` and early refresh.
"""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from .harness import (
    Case,
    Column,
    Options,
    Row,
    Suite,
    Unavailable,
    add_bar,
    add_case,
    add_suite,
    percentile,
    progress,
    us,
)

NAME = "stampede"
PROCESSES = 16
#: Seconds a value stays fresh, and seconds a build takes.
FRESH, BUILD = 1.0, 0.05
#: Reads of a fresh value timed in one process while the others wait (the hit's cost).
HITS = 2000
STARTUP_TIMEOUT = 120.0


def _reader(case: str, key: str) -> Callable[[Callable[[], Any]], Any]:
    """The case's get-or-set of ``key`` with a builder, built in the process."""
    from django.core.cache import caches

    # Looked up at each call, as `cache.get()` through Django's proxy and caching's calls
    # look theirs up (about 1.5 µs).
    if case == "plain":
        caches["redis"].set(key, "plain", None)
        return lambda build: caches["redis"].get(key)
    if case == "django":
        return lambda build: caches["redis"].get_or_set(key, build, FRESH)
    if case == "cacheops":
        from cacheops import cached_as

        from .shopbench.models import PlainProduct

        cached = cached_as(PlainProduct, timeout=int(FRESH), lock=True)(_cacheops_call)
        return lambda build: cached(key, build)
    if case == "dogpile":
        from dogpile.cache import make_region

        region = make_region().configure(
            "dogpile.cache.redis", expiration_time=FRESH,
            arguments={"url": os.environ["DISTLOCK_REDIS_URL"], "distributed_lock": True,
                       "redis_expiration_time": int(FRESH * 4), "thread_local_lock": False,
                       "lock_timeout": 30},
        )
        return lambda build: region.get_or_create(key, build)
    from django_distlock import caching

    stale = FRESH if "stale" in case else 0.0
    beta = 1.0 if "xfetch" in case else 0.0
    return lambda build: caching.get_or_set(key, build, FRESH, cache="redis", using="redis",
                                            stale=stale, beta=beta, wait=30)


def _cacheops_call(key: str, build: Callable[[], Any]) -> Any:
    """What ``cached_as`` wraps: its cache key is this function's and ``key``'s (the
    builder, a closure of each process, is left out of it)."""
    return build()


def _process(case: str, key: str, window: float, index: int, barrier: Any,
             results: Any) -> None:
    try:
        import django

        django.setup()
        builds: list[tuple[int, int]] = []

        def build() -> str:
            began = time.monotonic_ns()
            time.sleep(BUILD)
            builds.append((began, time.monotonic_ns()))
            return "value"

        read = _reader(case, key)
        read(build)  # connections open before the clock starts
        barrier.wait(STARTUP_TIMEOUT)
        hits: list[int] = []
        if index == 0:  # hits of a fresh value, alone: the others wait at the barrier
            read(build)
            for _ in range(HITS):
                started = time.perf_counter_ns()
                read(build)
                hits.append(time.perf_counter_ns() - started)
        builds.clear()
        barrier.wait(STARTUP_TIMEOUT)
        calls: list[tuple[int, int]] = []  # (began monotonic ns, took ns)
        until = time.monotonic() + window
        while time.monotonic() < until:
            began, started = time.monotonic_ns(), time.perf_counter_ns()
            read(build)
            calls.append((began, time.perf_counter_ns() - started))
        results.put(("done", os.getpid(), calls, builds, hits))
    except BaseException:
        results.put(("error", os.getpid(), traceback.format_exc(), [], []))
        barrier.abort()


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """Run every case's round ``--repeat`` times, interleaved; one row per case."""
    got: dict[str, list[tuple[Any, ...]]] = {case.name: [] for case in cases}
    for round_ in range(options.repeat):
        for case in cases:
            progress(f"{NAME}: {case.name}, round {round_ + 1}/{options.repeat}")
            got[case.name] += _round(case, options.duration)
    return [Row(case, _figures(got[case.name], options)) for case in cases]


def _round(case: Case, window: float) -> list[tuple[Any, ...]]:
    kind = case.factory.args[0]  # type: ignore[attr-defined]
    key = f"bench:{NAME}:{case.name}:{os.getpid()}:{time.time_ns()}"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_process, args=(kind, key, window, index, barrier, results),
                         daemon=True) for index in range(PROCESSES)]
    settings_module = os.environ.get("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    if kind == "cacheops":  # spawned children read the settings module from os.environ
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.stampede_settings"
    try:
        for proc in procs:
            proc.start()
    finally:
        os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    try:
        fired = [results.get(timeout=STARTUP_TIMEOUT + window) for _ in procs]
    except threading.BrokenBarrierError as exc:
        raise RuntimeError(f"{case.name}: a process failed") from exc
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    errors = [entry[2] for entry in fired if entry[0] == "error"]
    if errors:
        raise RuntimeError(errors[0])
    return fired


def _figures(fired: list[tuple[Any, ...]], options: Options) -> dict[str, Any]:
    latencies = sorted(took for entry in fired for _, took in entry[2])
    builds = sorted((b, e, entry[1]) for entry in fired for b, e in entry[3])
    # Calls under way while another process built (waiting for it, or served stale).
    during = sorted(took for entry in fired for began, took in entry[2]
                    if any(began < e and b < began + took and pid != entry[1]
                           for b, e, pid in builds))
    hits = sorted(took for entry in fired for took in entry[4])
    window = options.duration * options.repeat
    return {
        "calls": len(latencies),
        "builds": len(builds),
        "per_expiry": len(builds) / (window / FRESH),
        "overlap": _most_at_once(builds),
        "hit_p50": percentile(hits, 50),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        # No build in the run (the plain row): every call is a plain hit's.
        "rebuild_p99": percentile(during, 99) if builds else percentile(latencies, 99),
    }


def _most_at_once(builds: list[tuple[int, int, int]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(b, 1) for b, _, _ in builds] + [(e, -1) for _, e, _ in builds])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _kind(kind: str, key: str) -> Any:
    """The case factory's stand-in: a case here is a kind of reader (``factory.args[0]``)."""
    raise TypeError(f"{NAME} cases start processes, they build no Locker ({kind}, {key})")


def smoke(case: Case) -> None:
    """``--smoke``: the case's reader, twice in this process (cacheops: in a process of
    its settings module): one build, one hit.

    :raises AssertionError: when the reader built twice (or returned something else).
    """
    kind = case.factory.args[0]  # type: ignore[attr-defined]
    if kind == "cacheops":
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="benchmarks.stampede_settings")
        done = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); "
             f"from benchmarks.stampede import _smoke_here; _smoke_here({kind!r}, {case.name!r})"],
            env=env, capture_output=True, text=True, timeout=120,
        )
        if done.returncode != 0:
            raise AssertionError(f"{case.name}: {done.stderr}")
        return
    _smoke_here(kind, case.name)


def _smoke_here(kind: str, name: str) -> None:
    built: list[int] = []

    def build() -> str:
        built.append(1)
        return "value"

    read = _reader(kind, f"bench:smoke:{NAME}:{name}:{time.time_ns()}")
    values = [read(build), read(build)]
    if kind != "plain" and (values != ["value", "value"] or len(built) != 1):
        raise AssertionError(f"{name}: {values}, {len(built)} builds")


def setup() -> None:
    """Redis must be configured (the cache and the lock alias of benchmarks/settings.py).

    :raises Unavailable: without ``DISTLOCK_REDIS_URL``.
    """
    if not os.environ.get("DISTLOCK_REDIS_URL"):
        raise Unavailable("DISTLOCK_REDIS_URL is not set")
    from . import redis

    redis.setup()


def describe() -> str:
    """The one server, as the machine line shows it."""
    return "Redis through django-redis"


def _notes(options: Options) -> str:
    return (
        f"{PROCESSES} processes call get-or-set on one key in a loop for "
        f"{options.duration:g} s, {options.repeat} rounds; the value is fresh {FRESH:g} s "
        f"and takes {BUILD * 1000:g} ms to build. builds/expiry: builds over the window's "
        "expiries; overlap: the most builds at once; hit p50: "
        f"{HITS} reads of a fresh value in one process while the others wait, before the "
        "stampede; p50, p99: every call of the stampede; rebuild p99: calls under way "
        "while another process built (the plain row: all its calls). The ratios divide "
        "by the `plain` row (`cache.get()` of a key that never expires)."
    )


add_suite(
    Suite(
        name=NAME,
        title=f"Stampede: {PROCESSES} processes on one hot key that expires every {FRESH:g} s",
        run=run,
        columns=(
            Column("calls", "calls"),
            Column("builds", "builds"),
            Column("per_expiry", "builds/expiry", lambda v: f"{v:.2f}"),
            Column("overlap", "overlap"),
            Column("hit_p50", "hit p50 µs", us),
            Column("p50", "p50 µs", us),
            Column("p99", "p99 µs", us),
            Column("rebuild_p99", "rebuild p99 µs", us),
        ),
        ratio_metric="hit_p50",
        notes=_notes,
        smoke=smoke,
    )
)

_CASES = [
    ("stampede.plain", "plain", "`cache.get()` of a key that never expires (the floor)"),
    ("stampede.django", "django", "Django's `cache.get_or_set()` (no lock)"),
    ("stampede.dogpile", "dogpile", "dogpile.cache region, Redis `distributed_lock`"),
    ("stampede.cacheops", "cacheops", "django-cacheops `cached_as(lock=True)`"),
    ("stampede.distlock", "distlock", "`caching.get_or_set` (no stale, no early refresh)"),
    ("stampede.distlock-stale", "distlock-stale", f"`caching.get_or_set`, stale={FRESH:g}"),
    ("stampede.distlock-xfetch", "distlock-xfetch", "`caching.get_or_set`, early refresh"),
    ("stampede.distlock-stale-xfetch", "distlock-stale-xfetch",
     f"`caching.get_or_set`, stale={FRESH:g} and early refresh"),
]
for _module, _kind_name in (("dogpile.cache", "dogpile"), ("cacheops", "cacheops")):
    # A peer not installed: its row is left out (found, not imported: cacheops reads
    # Django's settings at import).
    if importlib.util.find_spec(_module.split(".")[0]) is None:
        _CASES = [case for case in _CASES if case[1] != _kind_name]
for _name, _kind_name, _what in _CASES:
    add_case(NAME, _name, functools.partial(_kind, _kind_name), _what, group="redis",
             reference="stampede.plain" if _kind_name == "plain" else None)
for _name, _kind_name, _ in _CASES:
    if _kind_name.startswith("distlock"):
        add_bar(NAME, _name, None, 1, "overlap")
add_bar(NAME, "stampede.distlock-xfetch", "stampede.plain", 1.2)
add_bar(NAME, "stampede.distlock-stale", "stampede.plain", 2.0, "rebuild_p99")
