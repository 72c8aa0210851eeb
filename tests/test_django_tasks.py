"""``@distlock`` under Django's tasks framework (``django.tasks``), run by real workers.

Not applicable by design where Django is older than 6.0 (the py311-django52 tox
env): ``django.tasks`` is new in Django 6.0, so the module skips there with that
reason, shown in the run's summary (``-ra``). The ``py312-django6`` tox env has
Django 6 and ``django-tasks-db`` (its deps) and runs it; with Django 6 a missing
``django-tasks-db`` or PostgreSQL fails the run.

The documented order: ``@task`` above ``@distlock``, so the task framework stores
the locking function and the lock is taken where the task runs. Here the tasks
are enqueued by one process into ``django-tasks-db``'s database backend on
PostgreSQL (``tests.django_tasks_settings``) and run by two ``manage.py
db_worker`` processes; every run checks from the worker that its lock is held,
and the history of all runs shows no two runs of one name overlapping.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import django
import pytest

if django.VERSION < (6, 0):
    pytest.skip(
        "not applicable by design: django.tasks is new in Django 6.0; the tox env "
        "py312-django6 runs this module",
        allow_module_level=True,
    )

from django.tasks import task

from django_distlock import distlock, locks

from .conftest import require_pg
from .test_flashsale import ROOT, _create_database

pytestmark = pytest.mark.django_versions

#: The lock every task of one report takes (the ``pg-lease`` alias: PostgreSQL).
NAME = "tasks-report:{day}"
HOLD = 0.4
TASKS = 6
WORKERS = 2


@task
@distlock(NAME, using="pg-lease", ttl=30, timeout=60)
def build_report(day: str) -> int:
    """Hold the report's lock for ``HOLD`` seconds in the worker; record the run."""
    start = time.time()
    held = locks["pg-lease"].is_locked(NAME.format(day=day))
    time.sleep(HOLD)
    line = {"day": day, "pid": os.getpid(), "start": start, "end": time.time(), "held": held}
    with open(os.environ["DISTLOCK_TASKS_HISTORY"], "a", encoding="utf-8") as history:
        history.write(json.dumps(line) + "\n")
    return os.getpid()


def _manage(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _done(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    out = proc.communicate(timeout=timeout)[0]
    assert proc.returncode == 0, f"{proc.args} exited with {proc.returncode}:\n{out}"
    return out


@pytest.mark.servers
def test_lock_held_while_the_task_runs_in_db_workers(tmp_path: Path) -> None:
    try:
        import django_tasks_db  # noqa: F401
    except ImportError:
        pytest.fail("django-tasks-db is missing: the py312-django6 tox env installs it.")
    require_pg()
    database = f"{os.environ.get('DISTLOCK_PG_NAME', 'distlock')}_tasks"
    _create_database(database)
    history = tmp_path / "history.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.django_tasks_settings",
        "DISTLOCK_PG_NAME": database,
        "DISTLOCK_SQLITE_DIR": str(tmp_path),
        "DISTLOCK_TASKS_HISTORY": str(history),
    }
    _done(_manage("migrate", "-v0", env=env))
    enqueue = (  # after clearing what an earlier, interrupted run left queued
        "from django_tasks_db.models import DBTaskResult\n"
        "DBTaskResult.objects.all().delete()\n"
        "from tests.test_django_tasks import build_report, TASKS\n"
        "for i in range(TASKS):\n"
        "    print(build_report.enqueue('d1' if i % 3 else 'd2').id)\n"
    )
    ids = _done(_manage("shell", "-v0", "-c", enqueue, env=env)).split()
    assert len(ids) == TASKS, ids
    workers = [
        _manage("db_worker", "--batch", "--no-startup-delay", "--no-reload", "--interval",
                "0.1", env=env)
        for _ in range(WORKERS)
    ]
    outputs = [_done(worker) for worker in workers]
    runs = [json.loads(line) for line in history.read_text().splitlines()]
    assert len(runs) == TASKS, (runs, outputs)
    # The lock was held by the worker while the task ran ...
    assert all(run["held"] for run in runs), runs
    # ... two workers ran tasks at once, and no two runs of one report overlapped.
    assert len({run["pid"] for run in runs}) == WORKERS, (runs, outputs)
    for day in ("d1", "d2"):
        spans = sorted((run["start"], run["end"]) for run in runs if run["day"] == day)
        pairs = itertools.pairwise(spans)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in pairs), spans


def _plain_report(day: str) -> None:
    """A module-level function (``@task`` refuses others) for the wrong order below."""


def test_distlock_above_task_fails_when_decorating() -> None:
    """The other order would lock around the enqueue, in the wrong process: refused."""
    enqueued = task(_plain_report)
    with pytest.raises(TypeError, match="not a callable"):
        distlock(NAME)(enqueued)  # type: ignore[type-var]
