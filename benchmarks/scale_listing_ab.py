"""``scale.listing`` before and after a change, in one run: the locks are written once per
case and size, then the API and the admin's held-locks page are timed with the code of an
earlier checkout (``--before``) and with this one, in turn (before, after, before, after
with ``--rounds 2``), each in a process of its own whose ``PYTHONPATH`` is that checkout.

Not a suite of ``python -m benchmarks``: a script. The stores, the check of what was
written and the admin's page process are ``scale.listing``'s (``benchmarks/scale_listing.py``).
Per code: ``held_locks(limit=50)`` (first page, page ``--depth`` + 1 by cursor, the prefix
search), ``count_held()`` at the page's cap, and the admin's page of the alias (first, page
``--depth`` + 1 by its "Next page" links, the search); medians of ``--repeat`` (of the
rounds' medians)::

    git archive <commit> | tar -x -C /tmp/before      # the code to compare with
    . /work/srvb/env
    flock /work/bench.lock python -m benchmarks.scale_listing_ab --before /tmp/before \\
        --cases zk --locks 10000 [--repeat 5] [--rounds 2] [--depth 99]

A case and size a run: ZooKeeper at 100,000 takes about 4 minutes (filling and deleting
are 2 of them; ``--depth 10`` keeps the walks short), the others about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .scale_listing import DEPTH, SEARCH, aliased, label, setup, verify
from .scale_listing_stores import TARGETS, Target

HERE = str(Path(__file__).resolve().parent.parent)
_API = """
import json, statistics, sys, time
from benchmarks.lockers import django_setup
django_setup()
from django.conf import settings
from django.test import override_settings
from django_distlock import locks
spec = json.loads(sys.argv[1])
def med(call):
    times = []
    for _ in range(spec["repeat"]):
        began = time.perf_counter(); call(); times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)
with override_settings(DISTLOCK={**settings.DISTLOCK, spec["alias"]: spec["entry"]}):
    backend, cursor = locks[spec["alias"]], None
    backend.held_locks(limit=50)
    for _ in range(spec["depth"]):
        cursor = backend.held_locks(limit=50, cursor=cursor).next_cursor
    print(json.dumps({
        "api_first": med(lambda: backend.held_locks(limit=50)),
        "api_deep": med(lambda: backend.held_locks(limit=50, cursor=cursor)),
        "api_search": med(lambda: backend.held_locks(prefix=spec["search"], limit=50)),
        "count": med(lambda: backend.count_held(limit=10_000)),
    }))
    locks.close_all()
"""
COLUMNS = ("api_first", "api_deep", "api_search", "count", "page_first", "page_deep",
           "page_search")


def in_checkout(root: str, args: list[str]) -> dict[str, Any]:
    """The last line of ``python args`` run in the checkout ``root``, as JSON."""
    env = {**os.environ, "PYTHONPATH": root}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=root, timeout=900, check=False)
    if done.returncode:
        raise RuntimeError(f"{root}: {args[:2]} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def timed(root: str, target: Target, repeat: int, depth: int) -> dict[str, float]:
    """The API's and the admin page's medians with the code of ``root``."""
    query = {"alias": target.alias}
    pages = in_checkout(root, ["-m", "benchmarks.admin_listing", "--against", json.dumps({
        "databases": target.databases(), "distlock": {target.alias: target.page_entry()},
        "pages": [["first", query, 0], ["deep", query, depth],
                  ["search", {**query, "q": SEARCH}, 0]],
        "repeat": repeat,
    })])
    api = in_checkout(root, ["-c", _API, json.dumps({
        "alias": target.alias, "entry": target.entry(), "repeat": repeat, "depth": depth,
        "search": SEARCH,
    })])
    return {**api, **{f"page_{k}": statistics.median(pages[k]["times"]) for k in pages}}


def main(argv: list[str] | None = None) -> int:
    """Fill, time both codes in turn, delete; print one JSON line per row, then a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a checkout of the earlier code")
    parser.add_argument("--cases", default="zk", help="comma-separated: " + ",".join(TARGETS))
    parser.add_argument("--locks", default="10000", help="comma-separated sizes")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--depth", type=int, default=DEPTH)
    args = parser.parse_args(argv)
    codes = {"before": str(Path(args.before).resolve()), "after": HERE}
    setup()
    rows: list[dict[str, Any]] = []
    for name in args.cases.split(","):
        for size in map(int, args.locks.split(",")):
            target = TARGETS[name]()
            with aliased(target) as backend:
                try:
                    began = time.perf_counter()
                    target.fill(backend, size)
                    fill = round(time.perf_counter() - began, 1)
                    verify(backend, size)
                    got: dict[str, list[dict[str, float]]] = {code: [] for code in codes}
                    for _ in range(args.rounds):
                        for code, root in codes.items():
                            got[code].append(timed(root, target, args.repeat, args.depth))
                    for code, runs in got.items():
                        row = {k: round(statistics.median(r[k] for r in runs), 1)
                               for k in COLUMNS}
                        rows.append({"case": f"{name}@{label(size)}", "code": code,
                                     "fill_s": fill, **row})
                        print(json.dumps(rows[-1]), flush=True)
                finally:
                    target.clear(backend, size)
    print("| case | code | " + " | ".join(f"{c} ms" for c in COLUMNS) + " |")
    print("| --- | --- |" + " ---: |" * len(COLUMNS))
    for row in rows:
        print(f"| `{row['case']}` | {row['code']} | "
              + " | ".join(f"{row[c]:.1f}" for c in COLUMNS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
