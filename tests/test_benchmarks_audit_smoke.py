"""``benchmarks/audit_activity.py`` still runs: a few hundred events instead of a million,
one request per case, on SQLite and on the PostgreSQL of this test run. Its timings are
printed, never asserted here (the bar is the benchmark's to report)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from .conftest import require_pg

ROOT = Path(__file__).resolve().parent.parent
CASES = 7


def test_the_activity_benchmark_runs_on_sqlite_and_postgresql() -> None:
    require_pg()
    db = settings.DATABASES["pg"]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DISTLOCK_PG_HOST": str(db["HOST"]),
        "DISTLOCK_PG_PORT": str(db["PORT"]),
        "DISTLOCK_PG_USER": str(db["USER"]),
        "DISTLOCK_PG_NAME": os.environ.get("DISTLOCK_PG_NAME", "distlock"),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the script configures its own
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.audit_activity", "--events", "500", "--repeat", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| default ")]
    assert len(rows) == CASES, done.stdout
    assert len([line for line in done.stdout.splitlines() if line.startswith("| pg ")]) == CASES
    assert "default: 500 events" in done.stderr and "pg: 500 events" in done.stderr
