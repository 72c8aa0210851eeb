"""``manage.py flashsale --via celery``: the purchases are Celery tasks run by real
``celery worker`` processes (prefork) that the command starts, with the Redis of
scripts/test as broker; the same table as the forked processes', read the same way
(tests/test_flashsale.py), with small counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import require_redis
from .test_flashsale import ALWAYS, LOCKLESS, ROOT, _env, _parse_table

pytestmark = [pytest.mark.django_versions, pytest.mark.servers]
STOCK, WORKERS = 8, 4


def _run(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "manage.py", "flashsale", "--via", "celery", "--workers",
               str(WORKERS), "--stock", str(STOCK), "--no-progress", *extra]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_flashsale_via_celery_sells_exactly_the_stock(tmp_path: Path) -> None:
    require_redis()
    proc = _run(_env(DISTLOCK_SQLITE_PATH=str(tmp_path / "flashsale.sqlite3")))
    output = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, output
    assert f"{WORKERS} Celery worker children" in proc.stdout, output
    rows = _parse_table(proc.stdout)
    for label in (*ALWAYS, "redis (redis)"):
        assert label in rows and not rows[label].skipped, output
    for row in rows.values():
        sold = int(row.cells["units sold"])
        if row.label == "no lock":
            assert sold >= STOCK, output
            continue
        assert row.cells["oversold"] == "0" and sold == STOCK, output
        assert (row.cells["lock wait p50 (ms)"] == "-") is (row.label in LOCKLESS), output
    assert "Verdict: PASS" in proc.stdout, output


def test_flashsale_via_celery_without_a_broker_says_what_to_set(tmp_path: Path) -> None:
    env = {key: value for key, value in _env().items()
           if key not in ("DISTLOCK_REDIS_URL", "DISTLOCK_CELERY_BROKER_URL")}
    env["DISTLOCK_SQLITE_PATH"] = str(tmp_path / "flashsale.sqlite3")
    proc = _run(env, "--strategies", "no-lock")
    assert proc.returncode == 1
    assert "--via celery needs a broker" in proc.stderr, proc.stderr


def test_the_testproject_celery_app_imports_without_a_broker() -> None:
    env = {key: value for key, value in _env().items()
           if key not in ("DISTLOCK_REDIS_URL", "DISTLOCK_CELERY_BROKER_URL")}
    proc = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); "
         "from testproject.celery import app; app.loader.import_default_modules(); "
         "print(app.conf.broker_url, sorted(t for t in app.tasks if t.startswith('shop.')))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "None", proc.stdout  # nothing configured, nothing sent
    assert "shop.sell_one" in proc.stdout and "shop.flashsale_buy" in proc.stdout, proc.stdout
