"""``python -m benchmarks.hops``: a traced acquire and release on every backend.

For one warmed, uncontended ``acquire()`` and one ``release()`` per alias it
counts, in the calling thread: the package's Python function calls, how deep
the package's frames nest, the package modules the call passes through, and the
socket sends (requests put on the wire; ZooKeeper's go out on kazoo's own
thread, so they show as 0). The design review counts these "hops" to see that a
refactoring added no layer and no round trip. Aliases whose server variable is
not set (``DISTLOCK_*``, see ``scripts/servers.py``) are left out.

    . <servers dir>/env && python -m benchmarks.hops
    python -m benchmarks.hops --check    # exit 1 if a count grew past the budget
    python -m benchmarks.hops --record   # write today's counts as the budget

The budget (``benchmarks/hops_budget.json``) is the hot path's bar: a warm
acquire or release that makes more package calls, nests deeper or sends more
than its recorded figure fails ``tests/test_hops_budget.py``. A change that
needs more records the new figures on purpose (``--record``) and says why in
its commit; a change that needs fewer records them too, so the bar follows.
The counts are deterministic for one checkout (the same run gives the same
table), so the check compares exactly, with no tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

PACKAGE = str(Path(__file__).resolve().parent.parent / "django_distlock")
SENDS = {"send", "sendall", "sendmsg", "sendto", "write"}
BUDGET = Path(__file__).resolve().parent / "hops_budget.json"
#: The figures the budget holds, per alias and operation (modules are shown, not held).
HELD = ("calls", "depth", "sends")


def configure() -> list[str]:
    """Configure Django with one alias per reachable backend; returns the aliases."""
    import django
    from django.conf import settings

    db = "django_distlock.backends.database.DatabaseBackend"
    tmp = tempfile.mkdtemp(prefix="distlock-hops-")
    databases: dict[str, Any] = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{tmp}/hops.sqlite3"}
    }
    aliases: dict[str, Any] = {
        "locmem": {"BACKEND": "django_distlock.backends.locmem.LocMemBackend"},
        "sqlite-lease": {"BACKEND": db},
        "sqlite-tx": {"BACKEND": db, "OPTIONS": {"MODE": "transaction"}},
    }
    env = os.environ
    if env.get("DISTLOCK_PG_PORT"):
        name = "distlock_hops"
        _create_pg_database(name)
        databases["pg"] = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": env.get("DISTLOCK_PG_HOST", "127.0.0.1"),
            "PORT": env["DISTLOCK_PG_PORT"],
            "USER": env.get("DISTLOCK_PG_USER", "postgres"),
            "NAME": name,
        }
        aliases["pg-lease"] = {"BACKEND": db, "OPTIONS": {"DATABASE": "pg"}}
        aliases["pg-tx"] = {"BACKEND": db, "OPTIONS": {"DATABASE": "pg", "MODE": "transaction"}}
        aliases["pg-session"] = {"BACKEND": db, "OPTIONS": {"DATABASE": "pg", "MODE": "session"}}
    if env.get("DISTLOCK_MYSQL_PORT"):
        name = "distlock_hops"
        _create_mysql_database(name)
        databases["mysql"] = {
            "ENGINE": "django.db.backends.mysql",
            "HOST": env.get("DISTLOCK_MYSQL_HOST", "127.0.0.1"),
            "PORT": env["DISTLOCK_MYSQL_PORT"],
            "USER": env.get("DISTLOCK_MYSQL_USER", "distlock"),
            "NAME": name,
            "OPTIONS": {"charset": "utf8mb4"},
        }
        aliases["mysql-lease"] = {"BACKEND": db, "OPTIONS": {"DATABASE": "mysql"}}
        aliases["mysql-tx"] = {"BACKEND": db,
                               "OPTIONS": {"DATABASE": "mysql", "MODE": "transaction"}}
        aliases["mysql-session"] = {"BACKEND": db,
                                    "OPTIONS": {"DATABASE": "mysql", "MODE": "session"}}
    redis = "django_distlock.backends.redis."
    if env.get("DISTLOCK_REDIS_URL"):
        aliases["redis"] = {
            "BACKEND": redis + "RedisBackend",
            "LOCATION": env["DISTLOCK_REDIS_URL"],
        }
    if env.get("DISTLOCK_REDLOCK_URLS"):
        aliases["redlock"] = {
            "BACKEND": redis + "RedlockBackend",
            "LOCATION": env["DISTLOCK_REDLOCK_URLS"].split(","),
        }
    if env.get("DISTLOCK_REDIS_CLUSTER_URL"):
        aliases["redis-cluster"] = {
            "BACKEND": redis + "RedisBackend",
            "LOCATION": env["DISTLOCK_REDIS_CLUSTER_URL"],
            "OPTIONS": {"CLUSTER": True},
        }
    if env.get("DISTLOCK_ZK_HOSTS"):
        aliases["zk"] = {
            "BACKEND": "django_distlock.backends.zookeeper.ZooKeeperBackend",
            "LOCATION": env["DISTLOCK_ZK_HOSTS"],
        }
    settings.configure(
        INSTALLED_APPS=["django_distlock"],
        DATABASES=databases,
        DISTLOCK=aliases,
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    from django.core.management import call_command

    for database in databases:
        call_command("migrate", database=database, verbosity=0)
    return list(aliases)


def _create_pg_database(name: str) -> None:
    import psycopg

    env = os.environ
    with psycopg.connect(
        host=env.get("DISTLOCK_PG_HOST", "127.0.0.1"),
        port=env["DISTLOCK_PG_PORT"],
        user=env.get("DISTLOCK_PG_USER", "postgres"),
        dbname="postgres",
        autocommit=True,
    ) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def _create_mysql_database(name: str) -> None:
    import MySQLdb

    env = os.environ
    conn = MySQLdb.connect(host=env.get("DISTLOCK_MYSQL_HOST", "127.0.0.1"),
                           port=int(env["DISTLOCK_MYSQL_PORT"]),
                           user=env.get("DISTLOCK_MYSQL_USER", "distlock"), autocommit=True)
    try:
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


class Trace:
    """Counts package calls, their nesting and socket sends while active."""

    def __init__(self) -> None:
        self.calls = 0
        self.depth = 0
        self.max_depth = 0
        self.sends = 0
        self.modules: set[str] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            if getattr(arg, "__name__", "") in SENDS and "socket" in repr(
                getattr(arg, "__self__", "")
            ):
                self.sends += 1
            return
        if event not in ("call", "return"):
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(PACKAGE):
            return
        if event == "call":
            self.calls += 1
            self.depth += 1
            self.max_depth = max(self.max_depth, self.depth)
            self.modules.add(filename[len(PACKAGE) + 1 :])
        else:
            self.depth -= 1


def traced(call: Any) -> Trace:
    """Run ``call()`` under a :class:`Trace` and return it."""
    trace = Trace()
    sys.setprofile(trace)
    try:
        call()
    finally:
        sys.setprofile(None)
    return trace


def measure() -> dict[str, dict[str, dict[str, int]]]:
    """Trace one warm acquire and release per reachable alias; the figures by alias."""
    aliases = configure()
    from django_distlock import locks

    figures: dict[str, dict[str, dict[str, int]]] = {}
    for alias in aliases:
        backend = locks[alias]
        for _ in range(20):  # warm: connections, scripts, first-use reads
            handle = backend.lock("hops", ttl=30, timeout=5)
            handle.acquire()
            handle.release()
        handle = backend.lock("hops", ttl=30, timeout=5)
        got = traced(handle.acquire)
        gone = traced(handle.release)
        figures[alias] = {
            op: {"calls": t.calls, "depth": t.max_depth, "modules": len(t.modules),
                 "sends": t.sends}
            for op, t in (("acquire", got), ("release", gone))
        }
    for alias in aliases:
        locks[alias].close()
    return figures


def over_budget(figures: dict[str, dict[str, dict[str, int]]],
                budget: dict[str, dict[str, dict[str, int]]]) -> list[str]:
    """What grew past ``budget`` (one line each), and the aliases it lacks."""
    grown = []
    for alias, ops in figures.items():
        if alias not in budget:
            grown.append(f"{alias}: not in the budget (record it: --record)")
            continue
        for op, counts in ops.items():
            for what in HELD:
                if counts[what] > budget[alias][op][what]:
                    grown.append(f"{alias} {op}: {counts[what]} {what}, budget "
                                 f"{budget[alias][op][what]}")
    return grown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="exit 1 past the budget")
    action.add_argument("--record", action="store_true", help="write the budget")
    parser.add_argument("--budget", type=Path, default=BUDGET, help="the budget's file")
    args = parser.parse_args(argv)
    figures = measure()
    columns = "calls | depth | modules | sends"
    print(f"| alias | acquire {columns} | release {columns} |")
    print("| --- " * 9 + "|")
    for alias, ops in figures.items():
        cells = " | ".join(str(ops[op][what]) for op in ("acquire", "release")
                           for what in ("calls", "depth", "modules", "sends"))
        print(f"| {alias} | {cells} |")
    if args.record:
        held = {alias: {op: {what: counts[what] for what in HELD} for op, counts in ops.items()}
                for alias, ops in figures.items()}
        args.budget.write_text(json.dumps(held, indent=2, sort_keys=True) + "\n")
        print(f"recorded in {args.budget}")
    elif args.check:
        grown = over_budget(figures, json.loads(args.budget.read_text()))
        for line in grown:
            print(f"OVER BUDGET: {line}")
        return 1 if grown else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
