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
    python -m benchmarks.audit_activity [--events 1000000] [--repeat 10] [--purge]

The full size is the default (``--events 1000000``: a fill of about 4 minutes per
database); ``--events 100000 --repeat 3`` runs in about a minute. On stderr, per
database: the bucket rows written per span and the mean number of slots in the wait and
hold histograms of the 2-hour rows (what the 7-day page sums). The fill writes every
span over the 7 days, as a site that never purges has them; ``--purge`` then runs
``purge()`` as the scheduled purge would (the short spans cut to ``buckets.KEEP``;
no event is old enough to go) and prints the rows left, before the pages are timed.

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
        # The class itself, not its dotted path: run as ``python -m`` this module is
        # ``__main__``, and the path would import a second copy whose ``alias`` main()
        # never sets (every page then read SQLite, the "pg" rows included).
        DATABASE_ROUTERS=[OneDatabase()],
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
    from django_distlock.contrib.audit import buckets
    from django_distlock.contrib.audit.models import LockEvent

    rng, now = random.Random(25), datetime.now(UTC)
    added: dict[Any, Any] = {}
    for first in range(0, count, BATCH):
        rows = [event(now, rng) for _ in range(min(BATCH, count - first))]
        LockEvent.objects.using(database).bulk_create([LockEvent(**row) for row in rows])
        buckets.merge(added, buckets.collect(rows))
    buckets.store(added, using=database)


def describe(database: str) -> str:
    """The bucket rows of ``database`` per span, and the mean histogram slots of its
    2-hour rows (the 7-day window's)."""
    from django.db.models import Count

    from django_distlock.contrib.audit.models import LockActivity

    rows = LockActivity.objects.using(database)
    per = dict(rows.values_list("span").annotate(n=Count("id")).order_by("span"))
    pairs = list(rows.filter(span=7200).values_list("waits", "holds"))
    waits = statistics.mean(len(w) for w, _ in pairs) if pairs else 0.0
    holds = statistics.mean(len(h) for _, h in pairs) if pairs else 0.0
    spans = ", ".join(f"{span} s: {n:,}" for span, n in per.items())
    return (f"{sum(per.values()):,} bucket rows ({spans}); 2-hour rows: {waits:.1f} wait "
            f"and {holds:.1f} hold histogram slots on average")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument(
        "--purge", action="store_true", help="purge() after the fill, as the scheduled purge"
    )
    args = parser.parse_args()
    databases = configure()

    from django.contrib.auth.models import User
    from django.db import connections
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_databases, teardown_databases

    from django_distlock.contrib.audit.purge import purge

    state = setup_databases(verbosity=0, interactive=False, aliases=set(databases))
    url = "/admin/distlock_audit/lockevent/activity/"
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
            print(f"{database}: {args.events} events, written in "
                  f"{time.perf_counter() - started:.1f} s: {describe(database)}",
                  file=sys.stderr)  # fmt: skip
            if args.purge:
                purge()
                print(f"{database}: after purge(): {describe(database)}", file=sys.stderr)
            client = Client()
            user = User.objects.create_superuser(f"bench-{database}", "b@example.com", "pw")
            client.force_login(user)
            with CaptureQueriesContext(connections[database]) as seen:
                client.get(url, {"window": "7d"})
            if not any("django_distlock_activity" in q["sql"] for q in seen.captured_queries):
                sys.exit(f"The page did not read {database}'s buckets.")
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
