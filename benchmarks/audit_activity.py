"""Server time of the admin's "Lock activity" page with 1,000,000 audit events (issue 25).

Not a suite of ``python -m benchmarks`` and not a test: a script that builds its own
throw-away databases (Django's test-database machinery: SQLite in a temporary folder,
and PostgreSQL when ``DISTLOCK_PG_PORT`` is set), writes ``--events`` audit rows spread
over the last 7 days on each (bulk inserts of the rows the recorder writes: holds,
failures, losses, force releases of 4 aliases and 20 name prefixes) with their activity
buckets (``audit/buckets.py``, as the recorder's writer adds them), then times the page
through Django's test client (the whole request: middleware, admin view, the bucket
query, the charts, the template) for each window, an alias filter and a prefix search,
and a search past a name's first ``:`` (read from the events, at most 200,000), and
prints a markdown table::

    . /tmp/srv/env    # scripts/servers.py start: DISTLOCK_PG_*
    python -m benchmarks.audit_activity [--events 1000000] [--repeat 10]

The bar (issue 25): a page renders in under 300 ms of server time at 1,000,000 events,
for every window.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

BAR_MS = 300.0
ALIASES = ("default", "redis", "zk", "reports")
PREFIXES = tuple(f"{word}:" for word in (
    "order", "invoice", "report", "sync", "mail", "stock", "cart", "user", "import", "export",
    "feed", "price", "index", "thumb", "backup", "cron", "queue", "cache", "pay", "ship",
))  # fmt: skip
#: Rows written per batch (one bulk insert and one bucket update each).
BATCH = 20_000


def configure() -> list[str]:
    """Settings with the throw-away databases; return their aliases."""
    import django
    from django.conf import settings

    from .admin_site import admin_settings

    folder = tempfile.mkdtemp(prefix="distlock-audit-bench-")
    databases: dict[str, Any] = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(folder, "db.sqlite3"),
            "TEST": {"NAME": os.path.join(folder, "test.sqlite3")},
        }
    }
    if os.environ.get("DISTLOCK_PG_PORT"):
        if os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1") != "127.0.0.1":
            sys.exit("Only 127.0.0.1 may be a target.")
        name = os.environ.get("DISTLOCK_PG_NAME", "postgres")
        databases["pg"] = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": "127.0.0.1",
            "PORT": os.environ["DISTLOCK_PG_PORT"],
            "USER": os.environ.get("DISTLOCK_PG_USER", "postgres"),
            "NAME": name,
            "TEST": {"NAME": f"{name}_bench_audit"},
        }
    settings.configure(**admin_settings(
        DATABASES=databases,
        DATABASE_ROUTERS=["benchmarks.audit_activity.OneDatabase"],
        DISTLOCK={"default": {"BACKEND": "django_distlock.backends.locmem.LocMemBackend"}},
    ))
    django.setup()
    return list(databases)


class OneDatabase:
    """Every query to the database being measured (:data:`OneDatabase.alias`)."""

    alias = "default"

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return self.alias

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return self.alias


def event(now: datetime, rng: random.Random) -> dict[str, Any]:
    """One row as the recorder writes it, at a random moment of the last 7 days."""
    at = now - timedelta(seconds=rng.random() * 7 * 86400)
    name = f"{rng.choice(PREFIXES)}{rng.randrange(100_000)}"
    row: dict[str, Any] = {
        "at": at, "alias": rng.choice(ALIASES), "name": name, "host": "web-1", "pid": 4242,
        "owner": "0123456789abcdef", "thread": "MainThread", "context": "/checkout/",
    }  # fmt: skip
    draw = rng.random()
    if draw < 0.9:
        held = rng.expovariate(20)
        kind = "released" if draw < 0.88 else "lost"
        row.update(kind=kind, held=held, waited=rng.expovariate(50))
        row["acquired_at"] = at - timedelta(seconds=held)
    elif draw < 0.999:
        row.update(kind="failed", waited=rng.expovariate(2))
    else:
        row.update(kind="force_released", actor="bench", reason="benchmark")
    return row


def fill(database: str, count: int) -> None:
    """Write ``count`` events to ``database`` in batches, and their buckets (counted in
    memory, written at the end: the page reads the same rows as if the recorder's writer
    had added each second's events)."""
    from django_distlock.audit import buckets
    from django_distlock.models import LockEvent

    rng, now = random.Random(25), datetime.now(UTC)
    added: dict[Any, Any] = {}
    for first in range(0, count, BATCH):
        rows = [event(now, rng) for _ in range(min(BATCH, count - first))]
        LockEvent.objects.using(database).bulk_create([LockEvent(**row) for row in rows])
        buckets.merge(added, buckets.collect(rows))
    buckets.store(added, using=database)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    databases = configure()

    from django.contrib.auth.models import User
    from django.test import Client
    from django.test.utils import setup_databases, teardown_databases

    from django_distlock.models import LockActivity

    state = setup_databases(verbosity=0, interactive=False, aliases=set(databases))
    url = "/admin/django_distlock/lockevent/activity/"
    cases = [(f"window {w}", {"window": w}) for w in ("1h", "6h", "24h", "7d")] + [
        ("7d, alias redis", {"window": "7d", "alias": "redis"}),
        ("7d, search order", {"window": "7d", "q": "order"}),
        ("24h, search order:4 (events)", {"window": "24h", "q": "order:4"}),
    ]
    try:
        print(f"| database | page ({args.events:,} events) | median ms | max ms | bar "
              f"{BAR_MS:.0f} ms |")  # fmt: skip
        print("| --- | --- | ---: | ---: | --- |")
        for database in databases:
            OneDatabase.alias = database
            started = time.perf_counter()
            fill(database, args.events)
            buckets_rows = LockActivity.objects.using(database).count()
            print(f"{database}: {args.events} events, {buckets_rows} bucket rows, written in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)  # fmt: skip
            client = Client()
            user = User.objects.create_superuser(f"bench-{database}", "b@example.com", "pw")
            client.force_login(user)
            for label, query in cases:
                times = []
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    response = client.get(url, query)
                    times.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 200, response.status_code
                median = statistics.median(times)
                verdict = "within" if median < BAR_MS else "OVER"
                print(f"| {database} | {label} | {median:.1f} | {max(times):.1f} | {verdict} |",
                      flush=True)  # fmt: skip
    finally:
        teardown_databases(state, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
