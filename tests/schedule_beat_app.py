"""A tiny Celery app for ``test_schedules_processes.py``'s beat test (self-contained).

Two ``celery beat`` processes (the classic mistake: beat started on every node)
and several workers share the real Redis of ``scripts/test`` as broker, on its
database 7 and a queue named by the test. Every beat sends ``restock_tick``
at every multiple of ``EVERY`` seconds of the Unix clock (:class:`aligned`, as
cron aligns to minutes), with the slot it fires for in the message; the task is a
:func:`~django_distlock.contrib.schedules.once_per_slot` job on the ``redis`` alias of
``tests.settings``, and appends ``{"slot", "ran", "pid"}`` to the history file.

Environment: ``DISTLOCK_REDIS_URL``, ``DISTLOCK_BEAT_QUEUE``, ``DISTLOCK_BEAT_JOB``
(the job's lock name), ``DISTLOCK_BEAT_HISTORY``, ``DISTLOCK_BEAT_READY`` (a
directory where each worker touches a file when ready).
"""

from __future__ import annotations

import json
import math
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from celery import Celery  # noqa: E402
from celery.schedules import schedstate, schedule  # noqa: E402
from celery.signals import before_task_publish, worker_ready  # noqa: E402

from django_distlock.contrib.schedules import once_per_slot  # noqa: E402

EVERY = 1.0
MIN_HOLD = 0.5
QUEUE = os.environ.get("DISTLOCK_BEAT_QUEUE", "distlock-beat")

app = Celery(
    "distlock_beat_test",
    broker=os.environ.get("DISTLOCK_REDIS_URL", "redis://127.0.0.1:6379").rsplit("/", 1)[0] + "/7",
)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
)


class aligned(schedule):  # lower case, as Celery names its schedules
    """Due at every multiple of ``run_every`` seconds of the Unix clock."""

    def is_due(self, last_run_at: datetime) -> schedstate:
        every = self.run_every.total_seconds()
        now = time.time()
        due = math.floor(now / every) > math.floor(last_run_at.timestamp() / every)
        return schedstate(is_due=due, next=every - now % every)


app.conf.beat_schedule = {
    "restock": {"task": "restock_tick", "schedule": aligned(EVERY), "options": {"queue": QUEUE}},
}


@before_task_publish.connect
def _stamp_slot(sender: str | None = None, body: Any = None, **kwargs: Any) -> None:
    """In a beat: put the slot the message fires for into its kwargs (a beat fires
    a slot at its start or later, never before: :class:`aligned`)."""
    if sender == "restock_tick":
        body[1]["slot"] = math.floor(time.time() / EVERY)


@worker_ready.connect
def _ready(sender: Any = None, **kwargs: Any) -> None:
    ready = os.environ.get("DISTLOCK_BEAT_READY")
    if ready:
        (Path(ready) / f"worker-{os.getpid()}").touch()


@once_per_slot(
    os.environ.get("DISTLOCK_BEAT_JOB", "beat-restock"), using="redis", max_hold=10,
    min_hold=MIN_HOLD,
)
def _restock() -> bool:
    return True


@app.task(name="restock_tick")
def restock_tick(slot: int = -1) -> bool:
    """Run the job if this worker wins the slot; record the firing either way."""
    ran = _restock() is not None
    line = json.dumps({"slot": slot, "ran": ran, "pid": os.getpid()})
    with open(os.environ["DISTLOCK_BEAT_HISTORY"], "a", encoding="utf-8") as history:
        history.write(line + "\n")
    return ran
