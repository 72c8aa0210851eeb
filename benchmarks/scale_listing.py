"""Suite ``scale.listing`` (issue 26, item 4; issue 25's held-locks page at scale): listing
and the admin's held-locks page with 10,000, 100,000 and 1,000,000 locks held per backend.

Per backend and size, the locks are written straight in the form the backend stores
(``fill``: Redis pipelines of what the acquire script writes, the lock string and the
listing index entry; one ``INSERT ... SELECT generate_series`` of lease rows into the
benchmark database's lock table; ZooKeeper container parents and ephemeral sequential
contenders sent as async calls, 4,000 per session), a sample is checked to be listed as
held, then timed: ``held_locks()`` through the backend API (the first page of 50, page 100
reached by its cursors, a prefix search matching 100 names), ``count_held()`` at the
page's cap (10,000, what the page's totals cost) and uncapped (1,000,000, once), and the
admin's held-locks page of the alias through Django's test client in a process of its own
(``python -m benchmarks.admin_listing --against``: the first page, page 100 reached by its
"Next page" links, the search). Then the locks are deleted. Medians of 5 x ``--repeat``.

    python -m benchmarks --suite scale.listing              # 10,000 locks, ~1 min
    python -m benchmarks.scale_listing --locks 10000,100000,1000000 [--repeat 1]

(the second form is the full run, about 5 minutes: it passes the other options to
``python -m benchmarks``). memcached (the cache backend) cannot list (its row says why);
ZooKeeper stops at ``ZK_MAX`` locks (2 znodes per lock on an ensemble of 256 MB heaps).
Rows exist for the servers configured (``DISTLOCK_REDIS_URL``,
``DISTLOCK_REDIS_CLUSTER_URL``, ``DISTLOCK_PG_PORT``, ``DISTLOCK_ZK_HOSTS``,
``DISTLOCK_MEMCACHED``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, cast

from .harness import (
    Case,
    Column,
    LockerFactory,
    Options,
    Ref,
    Row,
    Suite,
    Unavailable,
    add_bar,
    add_case,
    add_suite,
    progress,
)
from .scale_listing_stores import NAME, PREFIX, TARGETS, ZK_BASE, Target

SUITE = "scale.listing"
#: The search: 100 names at every size (a full page).
SEARCH = "lock:00050"
PAGE = 50
#: Pages walked before the deep one (page 100).
DEPTH = 99
BAR_MS = 300.0
SIZES_VARIABLE = "DISTLOCK_SCALE_LOCKS"


def sizes() -> list[int]:
    """The sizes of this run: ``DISTLOCK_SCALE_LOCKS`` (what ``--locks`` sets), 10,000."""
    return [int(n) for n in os.environ.get(SIZES_VARIABLE, "10000").split(",") if n.strip()]


def label(size: int) -> str:
    """10k, 100k, 1M."""
    return f"{size // 1_000_000}M" if size >= 1_000_000 else f"{size // 1000}k"


@contextmanager
def aliased(target: Target) -> Iterator[Any]:
    """The target's backend, its alias configured for the block."""
    from django.conf import settings
    from django.test import override_settings

    from django_distlock import locks

    with override_settings(DISTLOCK={**settings.DISTLOCK, target.alias: target.entry()}):
        try:
            yield locks[target.alias]
        finally:
            locks.close_all()


# --------------------------------------------------------------------------- measuring


def _median_ms(call: Callable[[], Any], reps: int) -> tuple[float, Any]:
    times, answer = [], None
    for _ in range(reps):
        started = time.perf_counter()
        answer = call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), answer


def deep_cursor(backend: Any, depth: int) -> str | None:
    """The cursor of page ``depth`` + 1, following the API's cursors."""
    cursor = None
    for _ in range(depth):
        cursor = backend.held_locks(limit=PAGE, cursor=cursor).next_cursor
    return cursor


def verify(backend: Any, count: int) -> None:
    """The first and last names written are listed as held, and so many are counted.

    :raises RuntimeError: when not (the stored form written is not the backend's).
    """
    for name in (NAME.format(0), NAME.format(count - 1)):
        page = backend.held_locks(prefix=name, limit=1)
        if [info.name for info in page] != [name]:
            raise RuntimeError(f"{backend.alias}: {name} written but not listed as held")
    expected = min(count, 10_000)
    counted = backend.count_held(limit=expected)
    if counted.count != expected and (counted.exact or (counted.at_most or 0) < expected):
        raise RuntimeError(f"{backend.alias}: {count} written, {counted} counted")


def admin_pages(target: Target, depth: int, repeat: int) -> dict[str, Any]:
    """The admin's page of the alias, timed in a process of its own (its settings are an
    admin site's): ``benchmarks.admin_listing --against``."""
    query = {"alias": target.alias}
    spec = {
        "databases": target.databases(),
        "distlock": {target.alias: target.page_entry()},
        "pages": [["first", query, 0], ["deep", query, depth],
                  ["search", {**query, "q": SEARCH}, 0]],
        "repeat": repeat,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        os.environ.get("PYTHONPATH", "")]))}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.admin_listing", "--against", json.dumps(spec)],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the admin's page process failed:\n{done.stderr[-3000:]}")
    return cast(dict[str, Any], json.loads(done.stdout.strip().splitlines()[-1]))


def measure(target: Target, size: int, reps: int, depth: int = DEPTH) -> dict[str, Any]:
    """Fill ``size`` locks, time the listing, the count and the page, delete them."""
    from django_distlock.backends.base import COUNT_CAP, MAX_COUNT_CAP
    from django_distlock.contrib.admin.operations.totals import describe

    values: dict[str, Any] = {"locks": size}
    with aliased(target) as backend:
        if not backend.supports_listing:
            why = backend.why_unsupported.get("supports_listing", "")
            return {**values, "note": f"cannot list: {why}"}
        if size > target.largest:
            return {**values, "note": f"not run above {target.largest:,}: {target.why_largest}"}
        started = time.perf_counter()
        try:
            target.fill(backend, size)
            values["fill_s"] = time.perf_counter() - started
            progress(f"{SUITE}: {target.alias} {size:,} held in {values['fill_s']:.1f} s")
            verify(backend, size)
            values["api_first"], _ = _median_ms(lambda: backend.held_locks(limit=PAGE), reps)
            cursor = deep_cursor(backend, depth)
            values["api_deep"], _ = _median_ms(
                lambda: backend.held_locks(limit=PAGE, cursor=cursor), reps)
            values["api_search"], _ = _median_ms(
                lambda: backend.held_locks(prefix=SEARCH, limit=PAGE), reps)
            values["count"], answer = _median_ms(lambda: backend.count_held(limit=COUNT_CAP),
                                                 reps)
            values["count_answer"] = describe(answer)
            values["count_all"], answer = _median_ms(
                lambda: backend.count_held(limit=MAX_COUNT_CAP), 1)
            values["count_all_answer"] = describe(answer)
            read_all = target.read_all(backend)
            if read_all is not None:
                spent, _ = _median_ms(read_all, reps)
                values["note"] = f"of which reading every lock parent's name: {spent:.1f} ms"
            progress(f"{SUITE}: {target.alias} API and counts timed; the page next")
            pages = admin_pages(target, depth, reps)
            for key in ("first", "deep", "search"):
                values[f"page_{key}"] = statistics.median(pages[key]["times"])
            if pages["deep"]["first"] != NAME.format(depth * PAGE):
                values["note"] = "; ".join(filter(None, [
                    values.get("note"), f"page {depth + 1} starts at {pages['deep']['first']}"]))
        finally:
            started = time.perf_counter()
            target.clear(backend, size)
            values["clear_s"] = time.perf_counter() - started
    for key in ("api_first", "page_first"):
        values[f"{key}_bar"] = values.get(key, math.nan) / BAR_MS
    return values


def make_target(name: str, key: str = "") -> Target:
    """The case's store (the factory of its case: ``key`` is not used)."""
    return TARGETS[name]()


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """One row per backend and size (sizes: :func:`sizes`)."""
    rows = []
    smallest = min(sizes())
    for size in sizes():
        for case in cases:
            progress(f"{SUITE}: {case.name} at {size:,} locks")
            target = TARGETS[case.name]()
            named = replace(case, name=f"{case.name}@{label(size)}", group=case.name,
                            reference=f"{label(smallest)} locks" if size == smallest else None)
            rows.append(Row(named, measure(target, size, 5 * options.repeat)))
    return rows


def smoke(case: Case) -> None:
    """120 locks (page 2 is the deep one), every measurement once.

    :raises RuntimeError: when a measurement fails or a listed backend lists nothing.
    """
    values = measure(TARGETS[case.name](), 120, 1, depth=1)
    if "note" not in values and math.isnan(values.get("page_first", math.nan)):
        raise RuntimeError(f"{case.name}: nothing measured: {values}")


# --------------------------------------------------------------------------- registration


def _ms(value: Any) -> str:
    return "n/a" if not isinstance(value, float) or math.isnan(value) else f"{value:,.1f}"


def _text(value: Any) -> str:
    return "" if isinstance(value, float) and math.isnan(value) else str(value)


def _notes(options: Options) -> str:
    return (
        f"Sizes {', '.join(f'{n:,}' for n in sizes())} (`--locks`); medians of "
        f"{5 * options.repeat}. API: `held_locks(limit={PAGE})` (first page, page "
        f"{DEPTH + 1} by cursor, prefix `{SEARCH}`); count: `count_held()` at the page's cap "
        "(10,000) and uncapped (1,000,000, once); page: the admin's held-locks page of the "
        "alias (test client, its own process: first, page 100 by 'Next page', search). "
        f"Bar: first page under {BAR_MS:.0f} ms at 1M (Redis, PostgreSQL)."
    )


COLUMNS = (
    Column("locks", "locks", lambda v: _text(f"{v:,}" if isinstance(v, int) else v)),
    Column("fill_s", "fill s", lambda v: _ms(v)),
    Column("api_first", "API first ms", _ms),
    Column("api_deep", "API p100 ms", _ms),
    Column("api_search", "API search ms", _ms),
    Column("page_first", "page first ms", _ms),
    Column("page_deep", "page p100 ms", _ms),
    Column("page_search", "page search ms", _ms),
    Column("count", "count ms (cap 10k)", _ms),
    Column("count_answer", "counted", _text),
    Column("count_all", "count ms (cap 1M)", _ms),
    Column("count_all_answer", "counted (cap 1M)", _text),
    Column("clear_s", "delete s", _ms),
    Column("note", "note", _text),
)

def _register() -> None:
    """The suite, its rows (the servers configured) and its bars."""
    add_suite(Suite(SUITE, "Listing and the held-locks page at 10k-1M held locks (`scale.listing`)",
                    run, COLUMNS, "api_first", _notes, smoke))
    what = {
        "redis": "Redis (one server)",
        "redis-cluster": "Redis Cluster (3 masters, 16 index tags)",
        "pg.lease": "PostgreSQL lease mode",
        "zk": "ZooKeeper ensemble (3 nodes)",
        "memcached": "Django cache on memcached",
    }
    for name, text in what.items():  # the rows of the servers configured
        if os.environ.get(TARGETS[name]().variable):
            factory = cast(LockerFactory, functools.partial(make_target, name))
            add_case(SUITE, name, factory, text, group=name)
    for name in ("redis", "pg.lease"):
        for metric in ("api_first_bar", "page_first_bar"):
            add_bar(SUITE, f"{name}@1M", None, 1.0, metric)
    add_bar(SUITE, "zk@100k", Ref("zk@10k", metric="api_first"), 1.5, "api_first")


if __name__ != "__main__":  # run as a script, main() imports this module as a module
    _register()


def setup() -> None:
    """Check the servers (127.0.0.1 only); set the benchmark database up.

    :raises Unavailable: when none is configured.
    """
    from .lockers import django_setup

    django_setup()
    if not any(os.environ.get(TARGETS[n]().variable) for n in TARGETS):
        raise Unavailable("no server configured (DISTLOCK_REDIS_URL, DISTLOCK_PG_PORT, ...)")
    if os.environ.get("DISTLOCK_PG_PORT"):
        from . import pg

        pg.setup()
        with pg.connect() as conn:  # an interrupted run's rows
            conn.execute("DELETE FROM django_distlock_lock WHERE name LIKE %s", [PREFIX + "%"])
    if os.environ.get("DISTLOCK_ZK_HOSTS"):  # earlier runs' roots, once the ensemble
        from kazoo.client import KazooClient  # reaped their emptied parents
        from kazoo.exceptions import NotEmptyError

        kazoo = KazooClient(hosts=os.environ["DISTLOCK_ZK_HOSTS"], timeout=30)
        kazoo.start(timeout=30)
        try:
            for child in kazoo.get_children(ZK_BASE) if kazoo.exists(ZK_BASE) else []:
                with contextlib.suppress(NotEmptyError):
                    kazoo.delete(f"{ZK_BASE}/{child}")
        finally:
            kazoo.stop()
            kazoo.close()


def describe() -> str:
    """What this suite adds to the machine line."""
    return f"scale.listing sizes {','.join(map(str, sizes()))}"


def main(argv: list[str] | None = None) -> int:
    """``--locks 10000,100000,1000000``, then ``python -m benchmarks``'s own options."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--locks" in args:
        at = args.index("--locks")
        os.environ[SIZES_VARIABLE] = args[at + 1]
        del args[at : at + 2]
    from .__main__ import main as benchmarks

    return benchmarks(["--suite", SUITE, *args])


if __name__ == "__main__":
    sys.exit(main())
