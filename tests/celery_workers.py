"""The ``celery_workers`` fixture (import ``workers_fixture`` to use it): two real
``celery worker`` processes (prefork, two children each) of ``testproject/celery.py``
with the suite's settings, consuming a queue of this run only, on the Redis of
scripts/test (database 11: tests/settings.py).

Started once per module that uses it; every wait is bounded; stopped (killed if
need be, pool children included) at teardown.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from django_distlock.contrib.celery.testing import CeleryWorkers

from .celery_tasks import FORK_PROBE
from .conftest import require_pg, require_redis

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Running:
    """The started workers, the app that sends to them, and the directory their tasks
    write notes and histories to."""

    app: Any
    workers: CeleryWorkers
    path: Path


@pytest.fixture(scope="module", name="celery_workers")
def workers_fixture(tmp_path_factory: Any, django_db_setup: None) -> Iterator[Running]:
    require_redis()
    require_pg()
    from testproject.celery import app

    path = tmp_path_factory.mktemp("celery")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        # The workers use the test database pytest-django made (its migrated tables).
        "DISTLOCK_PG_NAME": connections["pg"].settings_dict["NAME"],
        FORK_PROBE: str(path),
    }
    workers = CeleryWorkers("testproject", workers=2, concurrency=2, env=env,
                            log_dir=path / "logs", ready_timeout=60)
    app.conf.task_default_queue = workers.queue
    workers.start()
    try:
        yield Running(app, workers, path)
    finally:
        workers.stop()
