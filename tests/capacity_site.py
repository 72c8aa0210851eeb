"""A small Django site served by gunicorn (sync, gthread) or uvicorn, whose views take
locks on each kind of alias, and the counts of the connections it opens, read on the
servers themselves where they can tell whose they are (PostgreSQL's
``pg_stat_activity`` by ``application_name``, Redis' ``CLIENT LIST`` by client name),
else on the site's side (ZooKeeper, memcached: the established sockets of the
server's process tree, in ``/proc``).

``tests/test_capacity.py`` checks docs/capacity.md's budget with it; run as a module,
it measures the tables of that page (a few minutes; the servers of ``scripts/test``):

    python -m tests.capacity_site
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SETTINGS = '''
import os
SECRET_KEY = "capacity-site"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "capsite.urls"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_distlock"]
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql",
    "HOST": os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
    "PORT": os.environ["DISTLOCK_PG_PORT"],
    "USER": os.environ.get("DISTLOCK_PG_USER", "postgres"),
    "NAME": os.environ["CAPSITE_DB"],
    "CONN_MAX_AGE": int(os.environ.get("CAPSITE_CONN_MAX_AGE", "0")),
    "OPTIONS": {"application_name": "capsite"},
}}
_DB = "django_distlock.backends.database.DatabaseBackend"
DISTLOCK = {
    "default": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default",
                "ASYNC_SESSIONS": int(os.environ.get("CAPSITE_ASYNC_SESSIONS", "16"))}},
    "pg-tx": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default", "MODE": "transaction"}},
    "redis": {"BACKEND": "django_distlock.backends.redis.RedisBackend",
              "LOCATION": os.environ["DISTLOCK_REDIS_URL"] + "?client_name=capsite"
              + "&max_connections=" + os.environ.get("CAPSITE_REDIS_MAX", "50")},
    "zk": {"BACKEND": "django_distlock.backends.zookeeper.ZooKeeperBackend",
           "LOCATION": os.environ["DISTLOCK_ZK_HOSTS"]},
}
if os.environ.get("DISTLOCK_MEMCACHED"):
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
              "locks": {"BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
                        "LOCATION": os.environ["DISTLOCK_MEMCACHED"]}}
    DISTLOCK["cache"] = {"BACKEND": "django_distlock.backends.cache.CacheBackend",
                         "OPTIONS": {"CACHE": "locks"}}
'''

URLS = '''
import asyncio, random, time
from django.db import connection, transaction
from django.http import HttpResponse
from django.urls import path
from django_distlock import lock

NAMES = 8  # some contention: 64 clients on 8 names

def _query():
    with connection.cursor() as cursor:  # Django's own connection, as a real view has
        cursor.execute("SELECT 1")

def sync_view(request, alias):
    name = f"cap:{random.randrange(NAMES)}"
    if alias == "pg-tx":
        with transaction.atomic(), lock(name, using=alias, timeout=20):
            time.sleep(0.005)
            _query()
    elif alias == "none":
        _query()
    else:
        with lock(name, using=alias, timeout=20, ttl=30):
            time.sleep(0.005)
            _query()
    return HttpResponse("ok")

async def async_view(request, alias):
    async with lock(f"cap:{random.randrange(NAMES)}", using=alias, timeout=20, ttl=30):
        await asyncio.sleep(0.005)
    return HttpResponse("ok")

urlpatterns = [path("sync/<str:alias>/", sync_view), path("async/<str:alias>/", async_view)]
'''

ASGI = '''
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "capsite.settings")
from django.core.asgi import get_asgi_application
application = get_asgi_application()
'''

WSGI = ASGI.replace("asgi", "wsgi").replace("ASGI", "WSGI")

def write_site(directory: Path) -> None:
    """Write the site's package ``capsite`` (settings, urls, asgi, wsgi) in ``directory``."""
    package = directory / "capsite"
    package.mkdir(parents=True, exist_ok=True)
    for name, text in {"__init__": "", "settings": SETTINGS, "urls": URLS, "asgi": ASGI,
                       "wsgi": WSGI}.items():
        (package / f"{name}.py").write_text(text)


def pg_connect(dbname: str = "postgres") -> Any:
    """An autocommit psycopg connection to the PostgreSQL of ``DISTLOCK_PG_*``."""
    import psycopg

    return psycopg.connect(
        host=os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
        port=os.environ["DISTLOCK_PG_PORT"],
        user=os.environ.get("DISTLOCK_PG_USER", "postgres"),
        dbname=dbname,
        autocommit=True,
    )


def prepare_database(directory: Path, dbname: str) -> dict[str, str]:
    """Create ``dbname`` if missing and migrate it; return the site's environment."""
    with pg_connect() as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dbname])
        if found.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{dbname}"')
    env = site_env(directory, dbname)
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"],
        cwd=directory, env=env, check=True, timeout=120,
    )
    return env


def site_env(directory: Path, dbname: str, **extra: str) -> dict[str, str]:
    """The environment the site's processes run with."""
    paths = [str(directory), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "DJANGO_SETTINGS_MODULE": "capsite.settings",
        "CAPSITE_DB": dbname,
        **extra,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(kind: str, port: int, workers: int, threads: int) -> list[str]:
    """The command line of server ``kind`` (``sync``, ``gthread``, ``uvicorn``; for
    uvicorn, ``threads`` is ``--limit-concurrency``, 0 for none)."""
    bindir = Path(sys.executable).parent
    if kind == "uvicorn":
        limit = ["--limit-concurrency", str(threads)] if threads else []
        return [str(bindir / "uvicorn"), "capsite.asgi:application", "--host", "127.0.0.1",
                "--port", str(port), "--workers", str(workers), "--log-level", "warning",
                *limit]
    command = [str(bindir / "gunicorn"), "capsite.wsgi:application", "-b", f"127.0.0.1:{port}",
               "-w", str(workers), "-k", kind, "--log-level", "warning", "--timeout", "60"]
    if kind == "gthread":
        command += ["--threads", str(threads)]
    return command


@contextlib.contextmanager
def serve(directory: Path, env: dict[str, str], kind: str, workers: int,
          threads: int = 0) -> Iterator[tuple[str, int]]:
    """Run the site under ``kind`` until the block ends; yield its base URL and the
    server's pid."""
    port = free_port()
    process = subprocess.Popen(
        server_command(kind, port, workers, threads), cwd=directory, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} did not start: {process.communicate()[1][-2000:]}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _drive(url: str, concurrency: int, requests: int) -> Counter[int]:
    import httpx

    statuses: Counter[int] = Counter()
    remaining = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one_client() -> None:
            for _ in remaining:
                for attempt in range(3):  # a kept-alive connection the server just closed
                    try:
                        statuses[(await client.get(url)).status_code] += 1
                        break
                    except httpx.TransportError:
                        if attempt == 2:
                            statuses[0] += 1

        await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return statuses


def drive(url: str, concurrency: int, requests: int) -> Counter[int]:
    """GET ``url`` ``requests`` times from ``concurrency`` clients at once; the statuses
    (0: no answer in 3 tries)."""
    return asyncio.run(_drive(url, concurrency, requests))


def count_pg(conn: Any, dbname: str) -> int:
    """The site's connections to PostgreSQL now (``application_name`` capsite: Django's
    own and the lease sessions), read in the server's ``pg_stat_activity`` over
    ``conn`` (one kept open: the server may be full)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        " AND application_name = 'capsite'", [dbname]
    ).fetchone()
    return int(row[0])


def count_redis() -> int:
    """The site's clients of the Redis of ``DISTLOCK_REDIS_URL`` now (named capsite),
    read in the server's ``CLIENT LIST``."""
    import redis

    client = redis.Redis.from_url(os.environ["DISTLOCK_REDIS_URL"])
    try:
        return sum(1 for c in client.client_list() if c.get("name") == "capsite")
    finally:
        client.close()


def _children(root: int) -> set[int]:
    """``root`` and its descendants (from ``/proc``)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


def count_sockets(root: int, port: int) -> int:
    """Established TCP connections from process ``root``'s tree to ``port`` on
    127.0.0.1 (ZooKeeper's ``cons`` is not whitelisted on every ensemble; this reads
    the client side, in ``/proc``)."""
    inodes: set[str] = set()
    for pid in _children(root):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and remote_port == port and fields[9] in inodes:
                    count += 1
    return count


def counters(root: int, dbname: str, pg: Any) -> dict[str, Any]:
    """How to count the site's connections to each server, now (``pg``: a connection
    to read ``pg_stat_activity`` with)."""
    zk_ports = [int(h.rsplit(":", 1)[1]) for h in os.environ["DISTLOCK_ZK_HOSTS"].split(",")]
    found: dict[str, Any] = {
        "pg": lambda: count_pg(pg, dbname),
        "redis": count_redis,
        "zk": lambda: sum(count_sockets(root, port) for port in zk_ports),
    }
    if os.environ.get("DISTLOCK_MEMCACHED"):
        memcached = int(os.environ["DISTLOCK_MEMCACHED"].rsplit(":", 1)[1])
        found["memcached"] = lambda: count_sockets(root, memcached)
    return found


def peak_while(url: str, concurrency: int, requests: int,
               count: dict[str, Any]) -> tuple[Counter[int], dict[str, int]]:
    """Drive ``url`` and sample the connection counts of ``count`` meanwhile (every
    50 ms, in a thread); return the statuses and each server's peak."""
    import threading

    peaks = dict.fromkeys(count, 0)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for server, counter in count.items():
                peaks[server] = max(peaks[server], counter())
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        statuses = drive(url, concurrency, requests)
    finally:
        done.set()
        sampler.join()
    return statuses, peaks


def main() -> None:  # pragma: no cover - the measurement behind docs/capacity.md
    """Print, per server kind and alias, the peak connections at concurrency 64."""
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="capsite-"))
    write_site(directory)
    dbname = os.environ.get("DISTLOCK_PG_NAME", "distlock") + "_capsite"
    prepare_database(directory, dbname)
    layouts = [("sync", 2, 1), ("gthread", 2, 8), ("uvicorn", 2, 0), ("uvicorn", 2, 16)]
    views = [("sync", "none"), ("sync", "default"), ("sync", "pg-tx"), ("sync", "redis"),
             ("sync", "zk"), ("sync", "cache"), ("async", "default"), ("async", "redis"),
             ("async", "zk")]
    pg = pg_connect()
    for age in sys.argv[1:] or ["0", "60"]:
        for kind, workers, threads in layouts:
            for view, alias in views:
                if view == "async" and kind != "uvicorn":
                    continue
                env = site_env(directory, dbname, CAPSITE_CONN_MAX_AGE=age)
                with serve(directory, env, kind, workers, threads) as (base, pid):
                    count = counters(pid, dbname, pg)
                    statuses, peaks = peak_while(f"{base}/{view}/{alias}/", 64, 320, count)
                    after = {server: counter() for server, counter in count.items()}
                print(f"CONN_MAX_AGE={age} {kind} w={workers} t={threads} {view}/{alias}: "
                      f"{dict(statuses)} peak {peaks} after {after}", flush=True)


if __name__ == "__main__":
    main()
