"""Server time of the admin's held-locks page with 100,000 locks held (issue 13), and
of each backend's ``count_held()`` (issue 25: the totals at the top of the page).

Not a suite of ``python -m benchmarks`` and not a test: a script that builds
its own throw-away databases (Django's test-database machinery), holds
``--locks`` leases on each database alias (rows written directly, as the
lease backend writes them, in one transaction) and, when
``DISTLOCK_REDIS_URL`` / ``DISTLOCK_ZK_HOSTS`` are set, as many real Redis and
ZooKeeper locks (acquired through the backends by a few threads, under a root
of this run's own), then times pages through Django's test client (the whole
request: middleware, admin view, listing, template): the first page, a page
deep in the listing (reached by following "Next page" links), and a name-prefix
search, and prints a markdown table; then times ``count_held()`` on each alias at
the page's cap (10,000) and uncapped (1,000,000) and prints a second table::

    . /tmp/srv/env    # scripts/servers.py start: DISTLOCK_PG_*, DISTLOCK_REDIS_URL, ...
    python -m benchmarks.admin_listing [--locks 100000] [--repeat 20] [--depth 100]

The bar (issue 13): a page renders in under 300 ms of server time.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote

BAR_MS = 300.0
#: Locks held per ZooKeeper session. The end of a session writes one transaction
#: listing all its ephemeral nodes; past about 2 MB of paths (jute.maxbuffer twice)
#: it breaks the ensemble (ZOOKEEPER-4306): 100,000 locks in one session did.
ZK_PER_SESSION = 4000


def configure(locks: int) -> list[str]:
    import django
    from django.conf import settings

    from .admin_site import admin_settings

    folder = tempfile.mkdtemp(prefix="distlock-admin-bench-")
    databases: dict[str, Any] = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(folder, "db.sqlite3"),
            "TEST": {"NAME": os.path.join(folder, "test.sqlite3")},
        }
    }
    db = "django_distlock.backends.database.DatabaseBackend"
    distlock: dict[str, Any] = {"sqlite": {"BACKEND": db, "KEY_PREFIX": "s:"}}
    if os.environ.get("DISTLOCK_PG_PORT"):
        if os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1") != "127.0.0.1":
            sys.exit("Only 127.0.0.1 may be a target.")
        databases["pg"] = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": "127.0.0.1",
            "PORT": os.environ["DISTLOCK_PG_PORT"],
            "USER": os.environ.get("DISTLOCK_PG_USER", "postgres"),
            "NAME": os.environ.get("DISTLOCK_PG_NAME", "postgres"),
            "TEST": {"NAME": os.environ.get("DISTLOCK_PG_NAME", "distlock") + "_bench_admin"},
        }
        distlock["pg"] = {"BACKEND": db, "OPTIONS": {"DATABASE": "pg"}, "KEY_PREFIX": "p:"}
    url = os.environ.get("DISTLOCK_REDIS_URL", "")
    if url:
        if not url.startswith("redis://127.0.0.1:"):
            sys.exit("Only 127.0.0.1 may be a target.")
        distlock["redis"] = {
            "BACKEND": "django_distlock.backends.redis.RedisBackend",
            "LOCATION": url,
            "KEY_PREFIX": f"adminbench{uuid.uuid4().hex[:6]}:",
        }
    hosts = os.environ.get("DISTLOCK_ZK_HOSTS", "")
    if hosts:
        if any(not host.startswith("127.0.0.1:") for host in hosts.split(",")):
            sys.exit("Only 127.0.0.1 may be a target.")
        zk = {
            "BACKEND": "django_distlock.backends.zookeeper.ZooKeeperBackend",
            "LOCATION": hosts,
            "OPTIONS": {"ROOT": f"/distlock-adminbench-{uuid.uuid4().hex[:8]}"},
        }
        # One session per ZK_PER_SESSION locks (see hold_locks), one root: "zk" lists them.
        distlock["zk"] = zk
        for i in range(1, -(-locks // ZK_PER_SESSION)):
            distlock[f"zk-holder{i}"] = zk
    settings.configure(**admin_settings(
        DATABASES=databases,
        DISTLOCK=distlock,
    ))
    django.setup()
    return list(distlock)


def hold_rows(alias: str, count: int) -> None:
    """Write ``count`` held leases of ``alias`` as the lease backend stores them."""
    from django.db import connections, transaction

    from django_distlock import locks

    backend = locks[alias]
    database = backend.options.get("DATABASE", "default")
    now = datetime.now(UTC)
    rows = [
        (
            backend.make_key(f"bench:{i:06d}"),
            uuid.uuid4().hex,
            1,
            now,
            now + timedelta(hours=1),
            "bench-host",
            4242,
            "MainThread",
        )
        for i in range(count)
    ]
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        cursor.executemany(
            "INSERT INTO django_distlock_lock (name, owner, fencing, acquired_at, expires_at,"
            " host, pid, thread) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )


def hold_locks(alias: str, count: int) -> list[Any]:
    """Acquire ``count`` locks of ``alias`` through its backend (threads overlap the
    round trips); ZooKeeper's spread over the sessions of the ``zk-holder`` aliases."""
    from django_distlock import locks

    def take(start: int) -> list[Any]:
        taken = []
        for i in range(start, min(start + 1000, count)):
            holder = alias
            if alias == "zk" and i >= ZK_PER_SESSION:
                holder = f"zk-holder{i // ZK_PER_SESSION}"
            handle = locks[holder].lock(f"bench:{i:06d}", ttl=3600, timeout=30)
            handle.acquire()
            taken.append(handle)
        return taken

    with ThreadPoolExecutor(32) as pool:
        return [h for chunk in pool.map(take, range(0, count, 1000)) for h in chunk]


def deep_query(client: Any, url: str, query: dict[str, str], depth: int) -> dict[str, str]:
    """The query of page ``depth`` + 1, reached by following "Next page" links."""
    for _ in range(depth):
        page = client.get(url, query).content.decode()
        found = re.search(r'id="distlock-next" href="\?([^"]+)"', page)
        if found is None:
            break
        query = dict(parse_qsl(html.unescape(found.group(1))))
    return query


def time_page(client: Any, url: str, query: dict[str, str], repeat: int) -> tuple[list[float], str]:
    """Request the page ``repeat`` times; return each one's wall time (ms) and the last body.

    :raises AssertionError: when a response is not a 200.
    """
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url, query)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    return times, response.content.decode()


def time_counts(aliases: list[str], repeat: int) -> None:
    """Print the median and max time of ``count_held()`` per alias, at the page's cap and
    at the largest cap, with what it answered."""
    from django_distlock import locks
    from django_distlock.backends.base import COUNT_CAP, MAX_COUNT_CAP
    from django_distlock.contrib.admin.operations.totals import describe

    print()
    print("| count_held() | cap | answer | median ms | max ms |")
    print("| --- | ---: | --- | ---: | ---: |")
    for alias in aliases:
        for cap in (COUNT_CAP, MAX_COUNT_CAP):
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                answer = locks[alias].count_held(limit=cap)
                times.append((time.perf_counter() - started) * 1000)
            median = statistics.median(times)
            print(f"| {alias} | {cap:,} | {describe(answer)} | {median:.1f} | {max(times):.1f} |")


URL = "/admin/distlock_admin/heldlock/held/"


def against(spec: dict[str, Any]) -> dict[str, Any]:
    """Time the page over locks held elsewhere (``benchmarks/scale_listing.py`` fills the
    servers, then runs ``--against`` in a process of its own: this one's settings are an
    admin site's). ``spec``: ``databases`` (besides a throw-away SQLite ``default`` for
    the admin's users and sessions: used as they are, never created), ``distlock``,
    ``pages`` ([label, query, depth]: the query of the page ``depth`` + 1 pages in) and
    ``repeat``.

    :returns: per label, the times (ms), the rows shown and the first lock's name.
    """
    import django
    from django.conf import settings

    from .admin_site import admin_settings

    folder = tempfile.mkdtemp(prefix="distlock-admin-against-")
    default = {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(folder, "db.sqlite3"),
               "TEST": {"NAME": os.path.join(folder, "test.sqlite3")}}
    settings.configure(**admin_settings(
        DATABASES={"default": default, **spec["databases"]}, DISTLOCK=spec["distlock"]))
    django.setup()
    from django.contrib.auth.models import User
    from django.test import Client
    from django.test.utils import setup_databases, teardown_databases

    from django_distlock import locks

    state = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    out: dict[str, Any] = {}
    try:
        client = Client()
        client.force_login(User.objects.create_superuser("bench", "b@example.com", "pw"))
        client.get(URL, spec["pages"][0][1])  # untimed: imports, templates, connections
        for label, query, depth in spec["pages"]:
            query = deep_query(client, URL, query, depth) if depth else query
            times, page = time_page(client, URL, query, spec["repeat"])
            first = re.search(r"&amp;name=([^\"&]+)", page)
            out[label] = {"times": times, "rows": page.count('class="distlock-row"'),
                          "first": unquote(first.group(1)) if first else ""}
    finally:
        locks.close_all()
        teardown_databases(state, verbosity=0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="JSON spec: time pages over locks held elsewhere")
    parser.add_argument("--locks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--depth", type=int, default=100, help="pages to walk to the deep one")
    args = parser.parse_args()
    if args.against:
        print(json.dumps(against(json.loads(args.against))))
        return 0
    aliases = configure(args.locks)

    from django.contrib.auth.models import User
    from django.test import Client
    from django.test.utils import setup_databases, teardown_databases

    from django_distlock import locks

    state = setup_databases(verbosity=0, interactive=False)
    handles: dict[str, list[Any]] = {}
    try:
        for alias in [a for a in aliases if not a.startswith("zk-holder")]:
            started = time.perf_counter()
            if alias in ("redis", "zk"):
                handles[alias] = hold_locks(alias, args.locks)
            else:
                hold_rows(alias, args.locks)
            print(f"{alias}: {args.locks} locks held in {time.perf_counter() - started:.1f} s",
                  file=sys.stderr)  # fmt: skip
        client = Client()
        client.force_login(User.objects.create_superuser("bench", "b@example.com", "pw"))
        url = URL
        cases = [("all aliases, page 1", {})]
        for alias in [a for a in aliases if not a.startswith("zk-holder")]:
            deep = deep_query(client, url, {"alias": alias}, args.depth)
            cases += [
                (f"{alias}, page 1", {"alias": alias}),
                (f"{alias}, page {args.depth + 1}", deep),
                (f"{alias}, search bench:05", {"alias": alias, "q": "bench:05"}),
            ]
        head = f"| page ({args.locks:,} locks per alias) | rows | median ms | max ms |"
        print(f"{head} bar {BAR_MS:.0f} ms |")
        print("| --- | ---: | ---: | ---: | --- |")
        for label, query in cases:
            times, page = time_page(client, url, query, args.repeat)
            rows = page.count('class="distlock-row"')
            first = re.search(r"&amp;name=([^\"&]+)", page)
            label += f" (from {unquote(first.group(1))})" if first else ""
            median = statistics.median(times)
            verdict = "within" if median < BAR_MS else "OVER"
            print(f"| {label} | {rows} | {median:.1f} | {max(times):.1f} | {verdict} |")
        time_counts([a for a in aliases if not a.startswith("zk-holder")], args.repeat)
    finally:
        # ZooKeeper's are freed by the end of the session (close_all), at once.
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda handle: handle.release(), handles.get("redis", [])))
        locks.close_all()
        teardown_databases(state, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
