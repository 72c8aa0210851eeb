"""``python -m benchmarks``: run the suites, print a markdown table each, save them.

The tables go to stdout and to ``benchmarks/results/latest.md``; progress goes
to stderr. Exits 1 if a case module's server is missing (its rows are left
out), 2 on a bad command line.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .placement import CHOICES, PlacementError, placed

if TYPE_CHECKING:
    from .harness import Case, Options

#: Modules that register cases; each has ``setup()`` (raises Unavailable) and ``describe()``.
CASE_MODULES = ("benchmarks.pg", "benchmarks.mysql", "benchmarks.orm", "benchmarks.redis",
                "benchmarks.redis_kinds", "benchmarks.redis_sentinel",
                "benchmarks.scale_handoff",
                "benchmarks.redlock", "benchmarks.zookeeper", "benchmarks.cache",
                *(f"benchmarks.scale_server_{s}" for s in ("redis", "pg", "zk", "memcached")),
                "benchmarks.schedules", "benchmarks.scale_listing", "benchmarks.scale_throughput",
                "benchmarks.scale_mixed", "benchmarks.locmem", "benchmarks.stampede",
                "benchmarks.leadership", "benchmarks.ordering")
#: Suites run in this order by default; suites registered elsewhere follow.
SUITE_ORDER = ("uncontended", "contended", "asyncio")
RESULTS = Path(__file__).resolve().parent / "results" / "latest.md"

DEFAULTS = {  # (normal, --quick)
    "repeat": (3, 1),
    "iterations": (2000, 500),
    "warmup": (200, 100),
    "duration": (5.0, 2.0),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; unset numbers take their normal or ``--quick`` default."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--suite", default="", help="comma-separated suites, `orm` = orm.* (default: all)"
    )
    parser.add_argument(
        "--cases",
        default="",
        help="comma-separated patterns of case names, e.g. 'redis.*' (default: all); "
        "modules with no case chosen are not set up",
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter (< 1 min)")
    parser.add_argument("--repeat", type=int, help="rounds of every case (default 3, quick 1)")
    parser.add_argument("--iterations", type=int, help="timed pairs per round (uncontended)")
    parser.add_argument("--warmup", type=int, help="untimed pairs per round (uncontended)")
    parser.add_argument("--processes", type=int, default=8, help="processes on one key")
    parser.add_argument("--processes-list", default="4,16,64", help="scale.*: processes per cell")
    parser.add_argument("--hold-ms", type=float, default=1.0, help="hold time when contended")
    parser.add_argument("--duration", type=float, help="seconds per contended round (5, quick 2)")
    parser.add_argument("--list", action="store_true", help="list suites and cases, run nothing")
    parser.add_argument(
        "--placement", choices=CHOICES, default="free",
        help="pin the client and the servers: one CPU for both, or one each "
        "(default: free; see benchmarks/placement.py)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="build every case's client once and use it once (what the tests run), time nothing",
    )
    args = parser.parse_args(argv)
    for name, (normal, quick) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else normal)
    if min(args.repeat, args.iterations, args.processes) < 1 or args.warmup < 0:
        parser.error("--repeat, --iterations and --processes must be >= 1, --warmup >= 0")
    if args.duration <= 0 or args.hold_ms < 0:
        parser.error("--duration must be > 0 and --hold-ms >= 0")
    return args


def load_case_modules(chosen: set[str]) -> tuple[list[ModuleType], list[str]]:
    """Set up the case modules with a case in ``chosen`` (module names); return those
    ready and why others are not."""
    from .harness import Unavailable, progress

    ready, missing = [], []
    for name in CASE_MODULES:
        module = importlib.import_module(name)
        if name not in chosen:
            continue
        try:
            progress(f"setting up {name}")
            module.setup()
        except Unavailable as exc:
            missing.append(f"{name}: {exc}")
            continue
        ready.append(module)
    return ready, missing


def _expand(names: list[str], known: dict[str, object]) -> list[str]:
    """Suite names as given, a family name standing for its members (``orm``: ``orm.*``)."""
    out: list[str] = []
    for name in names:
        members = [k for k in known if k.startswith(name + ".")]
        out += [name] if name in known or not members else members
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the chosen suites; return the exit status."""
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    from . import (  # noqa: F401  (they register the suites)
        asyncio_contended,
        contention,
        harness,
        orm,
        uncontended,
    )

    for name in CASE_MODULES:  # they register their cases
        importlib.import_module(name)
    patterns = [p.strip() for p in args.cases.split(",") if p.strip()]

    def picked(case: Case) -> bool:
        return not patterns or any(fnmatch.fnmatchcase(case.name, p) for p in patterns)

    if args.list:
        for suite in harness.SUITES.values():
            print(f"{suite.name}: {suite.title}")
            for case in harness.CASES:
                if case.suite == suite.name and picked(case):
                    print(f"  {case.name:20} {case.what}")
        return 0
    default = [*(s for s in SUITE_ORDER if s in harness.SUITES), *harness.SUITES]
    chosen = [s.strip() for s in args.suite.split(",") if s.strip()]
    wanted = list(dict.fromkeys(_expand(chosen, harness.SUITES) or default))
    unknown = set(wanted) - set(harness.SUITES)
    if unknown:
        print(f"unknown suite(s) {sorted(unknown)}; known: {list(harness.SUITES)}", file=sys.stderr)
        return 2
    options = harness.Options(
        repeat=args.repeat,
        iterations=args.iterations,
        warmup=args.warmup,
        processes=args.processes,
        hold_ms=args.hold_ms,
        duration=args.duration,
        processes_list=tuple(int(n) for n in args.processes_list.split(",")),
        quick=args.quick,
    )
    chosen = [c for s in wanted for c in harness.CASES if c.suite == s and picked(c)]
    if not chosen:
        print(f"no case of suite(s) {wanted} matches --cases {args.cases!r}", file=sys.stderr)
        return 2
    modules, missing = load_case_modules({c.module for c in chosen})
    for line in missing:
        print(f"[benchmarks] SKIPPED {line}", file=sys.stderr)
    if not modules:
        print("[benchmarks] no server to measure: nothing run", file=sys.stderr)
        return 1
    names = {m.__name__ for m in modules}
    chosen = [c for c in chosen if c.module in names]
    if args.smoke:
        smoke(chosen)
        return 1 if missing else 0
    try:
        with placed(args.placement) as where:
            parts = run_suites(wanted, chosen, options, modules, where)
    except PlacementError as exc:
        print(f"[benchmarks] --placement {args.placement}: {exc}", file=sys.stderr)
        return 2
    if missing:
        parts.append("Skipped (server missing): " + "; ".join(missing) + "\n")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text("\n".join(parts))
    harness.progress(f"written to {RESULTS}")
    return 1 if missing else 0


def run_suites(wanted: list[str], chosen: list[Case], options: Options,
               modules: list[ModuleType], where: str) -> list[str]:
    """Run the chosen cases suite by suite; print and return the results' parts."""
    from . import harness

    parts = [harness.machine_line([*(m.describe() for m in modules), where]), ""]
    print(parts[0] + "\n", flush=True)
    done: dict[str, list[harness.Row]] = {}  # rows of the suites run so far, for their bars
    for suite_name in wanted:
        suite = harness.SUITES[suite_name]
        cases = [c for c in chosen if c.suite == suite_name]
        if not cases:
            continue
        done[suite_name] = suite.run(cases, options)
        table = harness.render(suite, done[suite_name], options, done)
        print(table, flush=True)
        parts.append(table)
    return parts


def smoke(cases: list[Case]) -> None:
    """Build every case's client once and use it once; print a line each.

    :raises Exception: what the first failing case raised.
    """
    from . import harness

    for case in cases:
        (harness.SUITES[case.suite].smoke or harness.smoke_locker)(case)
        print(f"smoke ok: {case.suite} {case.name}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
