"""docs/capacity.md's budget, counted on the server: a site under uvicorn (2 workers)
at concurrency 64, its views taking PostgreSQL lease locks, stays within the
connections the page states.

The site (``tests/capacity_site.py``) runs on a private PostgreSQL
(``scripts/servers.py``), so that its peak neither disturbs nor is disturbed by
other users of the shared server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .capacity_site import (
    counters,
    peak_while,
    pg_connect,
    prepare_database,
    serve,
    write_site,
)

# Single-tier, in the second env: it balances the two lanes of a whole run
# (CONTRIBUTING.md, the tiers).
pytestmark = pytest.mark.second_env

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2
CONCURRENCY = 64
ASYNC_SESSIONS = 8


@pytest.fixture(scope="module")
def private_pg() -> Iterator[dict[str, str]]:
    """A PostgreSQL of this module's own; its ``DISTLOCK_PG_*`` variables."""
    if not os.environ.get("DISTLOCK_PG_PORT") or shutil.which("su") is None:
        if os.environ.get("DISTLOCK_SERVERS") == "1":
            pytest.fail("PostgreSQL is required (DISTLOCK_SERVERS=1): run scripts/test")
        pytest.skip("no PostgreSQL (scripts/test starts one)")
    if os.environ.get("DISTLOCK_SERVERS") == "1":  # a full run: missing is a failure
        import httpx  # noqa: F401
        import uvicorn  # noqa: F401
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    # Not under pytest's 0700 base directory: the user postgres must reach it.
    directory = Path(tempfile.mkdtemp(prefix="distlock-capacity-pg-"))
    servers = [sys.executable, str(ROOT / "scripts" / "servers.py")]
    subprocess.run([*servers, "start", "--dir", str(directory), "--only", "postgres"],
                   check=True, capture_output=True, timeout=120)
    try:
        found = dict(
            line.removeprefix("export ").split("=", 1)
            for line in (directory / "env").read_text().splitlines()
            if line.startswith("export DISTLOCK_PG_")
        )
        yield found
    finally:
        subprocess.run([*servers, "stop", "--dir", str(directory)], capture_output=True,
                       timeout=120)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def site(private_pg: dict[str, str], tmp_path_factory: pytest.TempPathFactory,
         ) -> Iterator[tuple[Path, dict[str, str]]]:
    directory = tmp_path_factory.mktemp("capsite")
    write_site(directory)
    saved = {key: os.environ.get(key) for key in private_pg}
    os.environ.update(private_pg)
    try:
        env = prepare_database(directory, "capsite")
        env.update(CAPSITE_CONN_MAX_AGE="0", CAPSITE_ASYNC_SESSIONS=str(ASYNC_SESSIONS))
        yield directory, env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_uvicorn_at_concurrency_64_stays_within_the_budget(
    site: tuple[Path, dict[str, str]],
) -> None:
    """docs/capacity.md: under uvicorn, async views' leases use at most ``ASYNC_SESSIONS``
    connections per worker; sync views' at most one per request in flight (their
    thread's), with Django's own beside it, however many requests came before (before
    the fix, every request's thread left its session open: 199 connections after 640
    requests, until PostgreSQL refused more)."""
    directory, env = site
    with pg_connect() as pg, serve(directory, env, "uvicorn", WORKERS) as (base, pid):
        only_pg = {"pg": counters(pid, "capsite", pg)["pg"]}
        statuses, peaks = peak_while(f"{base}/async/default/", CONCURRENCY, 128, only_pg)
        assert statuses == {200: 128}
        assert 1 <= peaks["pg"] <= WORKERS * ASYNC_SESSIONS
        statuses, peaks = peak_while(f"{base}/sync/default/", CONCURRENCY, 384, only_pg)
        assert statuses == {200: 384}
        assert peaks["pg"] <= WORKERS * ASYNC_SESSIONS + 2 * CONCURRENCY


AT_THE_LIMIT = """
import django
django.setup()
from django_distlock import lock
from django_distlock.exceptions import BackendUnavailable
for alias in ("default", "pg-tx"):
    try:
        with lock("cap:full", using=alias, timeout=2):
            print(alias, "acquired")
    except BackendUnavailable as exc:
        print(alias, "BackendUnavailable", type(exc.__cause__).__name__)
"""


def test_a_full_server_is_backend_unavailable(site: tuple[Path, dict[str, str]]) -> None:
    """docs/capacity.md: when PostgreSQL refuses connections (``max_connections``
    reached), a lock call raises ``BackendUnavailable``, and nobody holds the name."""
    import psycopg

    directory, env = site
    held = []
    try:
        while len(held) < 1000:
            try:
                held.append(pg_connect())
            except psycopg.OperationalError as exc:
                assert "too many clients" in str(exc)
                break
        done = subprocess.run([sys.executable, "-c", AT_THE_LIMIT], cwd=directory, env=env,
                              capture_output=True, text=True, timeout=60)
    finally:
        for conn in held:
            conn.close()
    assert done.stdout.split("\n")[:2] == [
        "default BackendUnavailable OperationalError",
        "pg-tx BackendUnavailable OperationalError",
    ], done.stdout + done.stderr[-3000:]
    with pg_connect("capsite") as conn:
        rows = conn.execute("SELECT count(*) FROM django_distlock_lock WHERE name LIKE "
                            "'%%cap:full' AND expires_at > now()").fetchone()
    assert rows[0] == 0
