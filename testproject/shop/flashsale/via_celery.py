"""``manage.py flashsale --via celery``: the purchases are Celery tasks, run by real
``celery worker`` processes (prefork) that the command starts on a queue of its own."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connections

from django_distlock import locks
from django_distlock.contrib.celery.testing import CeleryWorkers

from .progress import Progress
from .strategies import Strategy
from .worker import SOLD_OUT, WorkerResult

#: Most rounds of purchase tasks sent for one strategy (each round: stock + workers).
MAX_ROUNDS = 5
#: Longest wait for one task's result.
RESULT_TIMEOUT = 120.0


@contextmanager
def celery_workers(workers: int) -> Iterator[Any]:
    """Start two ``celery worker`` processes of ``testproject`` sharing ``workers`` pool
    children; yield the app, sending to them; stop them at the end.

    :raises CommandError: when no broker is configured, or Celery is missing.
    """
    if not getattr(settings, "CELERY_BROKER_URL", None):
        raise CommandError(
            "--via celery needs a broker: set DISTLOCK_CELERY_BROKER_URL or DISTLOCK_REDIS_URL "
            "(testproject/settings.py)."
        )
    try:
        from testproject.celery import app
    except ImportError as exc:
        raise CommandError(f"--via celery needs Celery installed: {exc}") from exc
    # The workers open their own connections; none of ours may be inherited.
    connections.close_all()
    locks.close_all()
    count = 2 if workers > 1 else 1
    pool = CeleryWorkers("testproject", workers=count, concurrency=-(-workers // count),
                         env={**os.environ, "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE})
    app.conf.task_default_queue = pool.queue
    with pool:
        yield app


def run_strategy(strategy: Strategy, *, product_id: int, stock: int, workers: int,
                 work: float, progress: Progress) -> list[WorkerResult]:
    """Send purchase tasks with ``strategy`` until one finds the product sold out (at
    most :data:`MAX_ROUNDS` rounds of ``stock + workers`` tasks); one result per
    worker child that ran some."""
    from ..tasks import celery_flashsale_buy

    by_pid: dict[int, WorkerResult] = {}
    sold, started = 0, time.monotonic()
    args = (strategy.label, strategy.alias, strategy.kind, product_id, work)
    for _ in range(MAX_ROUNDS):
        sent = [celery_flashsale_buy.delay(*args) for _ in range(stock + workers)]
        sold_out = False
        for result in sent:
            outcome = result.get(timeout=RESULT_TIMEOUT)
            record = by_pid.setdefault(outcome["pid"], WorkerResult(
                f"celery-{outcome['pid']}", outcome["pid"], started=outcome["started"]))
            record.started = min(record.started or outcome["started"], outcome["started"])
            record.finished = max(record.finished or 0.0, outcome["finished"])
            record.outcomes[outcome["outcome"]] += 1
            if outcome["lock_wait"] is not None:
                record.lock_waits.append(outcome["lock_wait"])
            if outcome["error"] and len(record.errors) < 3:
                record.errors.append(outcome["error"])
            sold += outcome["outcome"] == "bought"
            sold_out = sold_out or outcome["outcome"] == SOLD_OUT
            progress.update(strategy.short, sold, stock, time.monotonic() - started)
        if sold_out:
            break
    progress.finish(strategy.short, sold, stock, time.monotonic() - started)
    return list(by_pid.values())
