"""The benchmarks still run: every case of every suite builds its client once and uses it
once (``python -m benchmarks --smoke``: one acquire+release, one save, one purchase), on
the PostgreSQL and the Redis of this test run, so a change that breaks a benchmark fails
here and not in the next ``scripts/bench``. In a local run without Redis, the Redis rows
are left out (and the run says so by exiting 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from .conftest import FULL_RUN, require_pg, require_redis, require_zookeeper

ROOT = Path(__file__).resolve().parent.parent
#: The benchmarks' own database on the tests' server (created and migrated on first use).
SMOKE_DB = "distlock_bench_smoke"


def _benchmarks(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _listed(stdout: str) -> set[tuple[str, str]]:
    """(suite, case) pairs of ``--list``'s output."""
    cases, suite = set(), ""
    for line in stdout.splitlines():
        if line.startswith("  "):
            cases.add((suite, line.split()[0]))
        elif line.strip():
            suite = line.split(":", 1)[0]
    return cases


def _smoke_env() -> dict[str, str]:
    """The benchmarks' environment: the tests' PostgreSQL, a database of their own."""
    db = settings.DATABASES["pg"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.settings",  # not the tests' (pytest exports it)
        "DISTLOCK_PG_HOST": str(db["HOST"]),
        "DISTLOCK_PG_PORT": str(db["PORT"]),
        "DISTLOCK_PG_USER": str(db["USER"]),
        "DISTLOCK_PG_NAME": "postgres",  # connected to while creating SMOKE_DB
        "DISTLOCK_BENCH_DB": SMOKE_DB,
    }
    return env


def test_every_benchmark_case_builds_its_client_and_uses_it_once() -> None:
    require_pg()
    if FULL_RUN:
        require_redis()  # scripts/test started the servers: the Redis rows must run too
    env = _smoke_env()
    if os.environ.get("DISTLOCK_ZK_HOSTS") and not os.environ.get("DISTLOCK_ZK_STANDALONE"):
        # scripts/test starts no standalone ZooKeeper (scripts/bench does): one node of
        # the ensemble serves the zk1.* lockers just as well for a smoke run
        env["DISTLOCK_ZK_STANDALONE"] = os.environ["DISTLOCK_ZK_HOSTS"].split(",")[0]
    listed = _benchmarks("--list", env=env)
    assert listed.returncode == 0, listed.stderr
    cases = _listed(listed.stdout)
    assert {"uncontended", "contended", "asyncio", "orm.save", "orm.sale"} <= {
        suite for suite, _ in cases
    }

    # benchmarks.redis needs DISTLOCK_REDIS_URL, as the tests' "redis" alias does, and
    # benchmarks.redlock DISTLOCK_REDLOCK_URLS, as the tests' "redlock" alias does
    if FULL_RUN:
        require_redis(redlock=True)
        require_zookeeper()  # and benchmarks.zookeeper DISTLOCK_ZK_HOSTS, as "zk" does
    skipped = {
        case
        for case in cases
        for alias in ("redis", "redlock", "zk")
        if alias not in settings.DISTLOCK and case[1].split(".")[0] in (alias, alias + "1")
    }
    # benchmarks.redis_sentinel needs scripts/servers.py's sentinel group
    if FULL_RUN:
        assert os.environ.get("DISTLOCK_SENTINEL_MASTER_URL"), "Sentinel is missing"
    elif not os.environ.get("DISTLOCK_SENTINEL_MASTER_URL"):
        skipped |= {case for case in cases if case[1].startswith("sentinel.")}

    smoked = _benchmarks("--smoke", env=env)

    assert smoked.returncode == (1 if skipped else 0), smoked.stdout + smoked.stderr
    done = {
        (line.split()[2], line.split()[3])
        for line in smoked.stdout.splitlines()
        if line.startswith("smoke ok: ")
    }
    assert done == cases - skipped, smoked.stdout + smoked.stderr


def test_the_contended_analysis_counts_holds_beyond_the_limit_as_overlaps() -> None:
    """A semaphore's row (``at_once`` n) counts a grant as an overlap only while n holds
    are open; an exclusive row, any two open holds."""
    from benchmarks.contention import RoundResult, analyse

    ms = 1_000_000
    # three holds open together over 3..4 ms; a fourth begins at 10 ms, after them
    grants = [(0, 1 * ms, 5 * ms), (1, 2 * ms, 6 * ms), (2, 3 * ms, 7 * ms), (0, 10 * ms, 11 * ms)]
    history = RoundResult(starts=[0, 0, 0], grants=grants, timeouts=0)
    assert analyse(history, 1.0, 0.0).overlaps == 2
    assert analyse(history, 1.0, 0.0, at_once=2).overlaps == 1
    assert analyse(history, 1.0, 0.0, at_once=3).overlaps == 0
    assert analyse(history, 1.0, 0.0, at_once=3).handoffs == []


def test_the_celery_benchmark_sends_each_task_once() -> None:
    """``benchmarks/celery_tasks.py`` (not a harness suite: it starts a worker) smoke-runs."""
    require_pg()
    require_redis()
    smoked = subprocess.run(
        [sys.executable, "-m", "benchmarks.celery_tasks", "--smoke"], cwd=ROOT,
        env=_smoke_env(), capture_output=True, text=True, timeout=120,
    )
    assert smoked.returncode == 0, smoked.stdout + smoked.stderr
    assert "smoke: redis, pg ok" in smoked.stdout, smoked.stdout + smoked.stderr
