"""The audit trail's recorder: lock events queued by signal receivers, written off the hot path."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_distlock import locks, signals
from django_distlock.contrib.audit import AuditSettings, parse_audit
from django_distlock.contrib.audit import recorder as recorder_module
from django_distlock.contrib.audit.models import LockActivity, LockEvent
from django_distlock.contrib.audit.recorder import Recorder, recorder
from django_distlock.exceptions import InvalidBackendOptions, LockLost

from . import audit_exit
from .conftest import require_redis

pytestmark = [pytest.mark.django_versions, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def audited(settings: Any) -> Iterator[None]:
    """locmem audited fully, "locmem-sampled" at 0; the queue emptied before and after."""
    base = settings.DISTLOCK["locmem"]
    recorder.flush()
    LockEvent.objects.all().delete()
    LockActivity.objects.all().delete()
    with override_settings(
        DISTLOCK={
            **settings.DISTLOCK,
            "locmem": {**base, "AUDIT": True},
            "locmem-none": {**base, "AUDIT": {"SAMPLE": 0}},
        }
    ):
        yield
    recorder.flush()


def test_an_acquire_that_raised_is_a_failed_row_with_the_error(settings: Any) -> None:
    """The server failed the acquire (``lock_acquire_failed``): a row of kind failed
    whose reason is the error, counted among the failures."""
    require_redis()
    from django_distlock.exceptions import BackendUnavailable
    from django_distlock.testing import backend_unavailable

    recorder.flush()
    LockEvent.objects.all().delete()
    audited = {**settings.DISTLOCK, "redis": {**settings.DISTLOCK["redis"], "AUDIT": True}}
    with override_settings(DISTLOCK=audited), backend_unavailable("redis") as broken, \
            pytest.raises(BackendUnavailable) as raised:
        broken.lock("audit:down", timeout=1).acquire()
    recorder.flush()
    (row,) = LockEvent.objects.filter(alias="redis")
    assert (row.kind, row.name) == ("failed", "audit:down")
    assert row.reason == f"BackendUnavailable: {raised.value}" and row.waited is not None


def test_a_hold_is_one_row_with_its_wait_and_hold_times(audited: None) -> None:
    handle = locks["locmem"].lock("audit:a", ttl=30)
    handle.acquire()
    owner = handle.owner_id
    assert not locks["locmem"].lock("audit:a", blocking=False).acquire()
    recorder.flush()
    assert list(LockEvent.objects.values_list("kind", flat=True)) == ["failed"]  # held still
    time.sleep(0.05)
    handle.release()
    recorder.flush()
    events = list(LockEvent.objects.order_by("id").values_list("kind", "name"))
    assert events == [("failed", "audit:a"), ("released", "audit:a")]
    failed, released = LockEvent.objects.order_by("id")
    assert failed.waited is not None and failed.owner != owner
    assert released.waited is not None and released.waited >= 0
    assert released.held is not None and released.held >= 0.05
    assert released.acquired_at is not None
    assert abs((released.at - released.acquired_at).total_seconds() - released.held) < 0.01
    assert released.host == handle.holder.host and released.pid == handle.holder.pid
    assert released.owner == owner and released.fencing_token == handle.fencing_token
    # The activity buckets were counted in the same write: one acquisition, one hold.
    minute = LockActivity.objects.get(span=60, alias="locmem", prefix="audit:", acquired=1)
    assert (minute.failed, sum(minute.holds.values())) == (1, 1)


def test_a_reentrant_hold_is_a_row_per_acquisition(audited: None, settings: Any) -> None:
    require_redis()
    redis = {**settings.DISTLOCK["redis"], "AUDIT": True}
    with override_settings(DISTLOCK={**settings.DISTLOCK, "redis": redis}):
        handle = locks["redis"].lock(f"audit:again:{uuid.uuid4().hex}", ttl=30, reentrant=True)
        with handle:
            time.sleep(0.05)
            with handle:
                pass
        recorder.flush()
    inner, outer = LockEvent.objects.filter(name=handle.name).order_by("id")
    assert inner.acquired_at is not None and outer.acquired_at is not None
    assert inner.acquired_at > outer.acquired_at and inner.at <= outer.at
    assert outer.waited is not None and inner.waited is not None


def test_a_celery_pool_process_shutting_down_writes_its_queue(audited: None) -> None:
    """A prefork pool process exits without ``atexit``: Celery's
    ``worker_process_shutdown`` drains the queue, with the holds still open."""
    from celery import signals as celery_signals

    recorder_module.connect()  # connected while Celery is imported
    recorder.interval = 3600
    try:
        time.sleep(recorder_module.FLUSH_INTERVAL + 0.2)  # the writer now waits an hour
        with locks["locmem"].lock("audit:pool:done", ttl=30):
            pass
        kept = locks["locmem"].lock("audit:pool:open", ttl=30)
        kept.acquire()
        celery_signals.worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
        kinds = dict(LockEvent.objects.values_list("name", "kind"))
        assert kinds == {"audit:pool:done": "released", "audit:pool:open": "acquired"}
        kept.release()
    finally:
        recorder.interval = recorder_module.FLUSH_INTERVAL
        recorder._wake.set()  # the writer waits an hour: back to every second now
        recorder.flush()


def test_a_lost_hold_is_one_row_too(audited: None) -> None:
    handle = locks["locmem"].lock("audit:lost", ttl=0.1)
    handle.acquire()
    time.sleep(0.2)
    locks["locmem"].lock("audit:lost", ttl=30, blocking=False).acquire()  # takes it over
    with pytest.raises(LockLost):
        handle.release()
    recorder.flush()
    kinds = list(LockEvent.objects.filter(owner=handle.owner_id).values_list("kind", flat=True))
    assert kinds == ["lost"]
    lost = LockEvent.objects.get(owner=handle.owner_id)
    assert lost.held is not None and lost.held >= 0.2 and lost.waited is not None


def test_sampling_keeps_whole_holds(audited: None, settings: Any) -> None:
    with override_settings(
        DISTLOCK={**settings.DISTLOCK, "locmem": {**settings.DISTLOCK["locmem"],
                                                   "AUDIT": {"SAMPLE": 0.5}}}
    ):  # fmt: skip
        for index in range(200):
            with locks["locmem"].lock(f"sample:{index}", ttl=30):
                pass
        recorder.flush()
    rows = LockEvent.objects.filter(name__startswith="sample:")
    assert 50 < rows.count() < 150  # about half (a 1e-12 chance of a false failure)
    # Each sampled hold was noted at its acquisition: its row has the wait.
    assert not rows.filter(waited__isnull=True).exists()


def test_no_query_on_the_hot_path_and_the_thread_writes_later(audited: None) -> None:
    with (
        CaptureQueriesContext(connections["default"]) as queries,
        locks["locmem"].lock("audit:b", ttl=30),
    ):
        pass
    assert len(queries) == 0  # the events are queued, not written, by this thread
    recorder.interval = 0.05
    try:
        for _ in range(100):
            if LockEvent.objects.filter(name="audit:b").count() == 1:
                break
            time.sleep(0.05)
        assert LockEvent.objects.filter(name="audit:b").count() == 1
    finally:
        recorder.interval = recorder_module.FLUSH_INTERVAL


def test_sampling_zero_and_off_record_nothing(audited: None) -> None:
    with locks["locmem-none"].lock("audit:c", ttl=30):
        pass
    with locks["default"].lock("audit:c", ttl=30):
        pass
    recorder.flush()
    assert not LockEvent.objects.exists()


def test_the_queue_is_bounded_and_counts_what_it_drops() -> None:
    small = Recorder(capacity=2, interval=3600)
    for index in range(5):
        small.add({"name": str(index)})
    assert len(small._queue) == 2 and small.dropped == 3


def test_a_failed_write_drops_and_counts(audited: None, caplog: pytest.LogCaptureFixture) -> None:
    small = Recorder(capacity=10, interval=3600)
    small.add({"no_such_field": 1})
    with caplog.at_level("WARNING", logger="django_distlock.contrib.audit.recorder"):
        assert small.flush() == 0 and small.dropped == 1
    # The logger is named after the module (docs/admin-dashboard.md names it).
    assert [r.name for r in caplog.records] == ["django_distlock.contrib.audit.recorder"]


def test_force_release_is_recorded_unless_an_operator_signal_describes_it(
    audited: None,
) -> None:
    locks["locmem"].lock("audit:d", ttl=30).acquire()
    with signals.by_operator():  # the admin app sends lock_released_by_operator after
        assert locks["locmem"].force_release("audit:d")
    locks["locmem"].lock("audit:e", ttl=30).acquire()
    assert locks["locmem"].force_release("audit:e")
    recorder.flush()
    forced = LockEvent.objects.filter(kind="force_released")
    assert list(forced.values_list("name", flat=True)) == ["audit:e"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        (False, None),
        (True, AuditSettings()),
        ({"SAMPLE": 0.5, "RETENTION_DAYS": None}, AuditSettings(0.5, None)),
    ],
)
def test_audit_settings(raw: Any, expected: AuditSettings | None) -> None:
    assert parse_audit("x", raw) == expected


@pytest.mark.parametrize(
    "raw", ["yes", {"SAMPLE": 2}, {"SAMPLE": True}, {"RETENTION_DAYS": 0}, {"OTHER": 1}]
)
def test_bad_audit_settings(raw: Any) -> None:
    with pytest.raises(InvalidBackendOptions):
        parse_audit("x", raw)


def _run_exiting(database: dict[str, Any], how: str) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parent.parent
    return subprocess.Popen(
        [sys.executable, "-m", "tests.audit_exit", json.dumps(database), how],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _sqlite_database() -> dict[str, Any]:
    db = connections["default"].settings_dict
    return {"ENGINE": db["ENGINE"], "NAME": str(db["NAME"]), "OPTIONS": {"timeout": 20}}


@pytest.mark.parametrize("how", ["exit", "sigterm"])
def test_events_queued_at_a_graceful_exit_are_written(how: str) -> None:
    """400 holds queued within the last second and 3 still open, then the process exits:
    by returning from its main, or by a SIGTERM handler that calls sys.exit (gunicorn's
    workers). Every hold is written, the open ones as ``acquired``."""
    LockEvent.objects.all().delete()
    process = _run_exiting(_sqlite_database(), how)
    try:
        if how == "sigterm":
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
            process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    rows = LockEvent.objects.filter(name__startswith=f"exit:{how}:")
    assert rows.filter(kind="released").count() == audit_exit.EVENTS
    opened = rows.filter(kind="acquired")
    assert sorted(opened.values_list("name", flat=True)) == [
        f"exit:{how}:open:{i}" for i in range(audit_exit.OPEN)
    ]
    assert not opened.filter(waited__isnull=True).exists()


def test_gunicorn_workers_stopped_by_sigterm_write_every_hold() -> None:
    """Real gunicorn, two sync workers: requests hold and release audited locks (each
    row queued, not written, when the answer goes out), some holds are kept; SIGTERM
    to the master stops the workers gracefully and every hold is in the trail."""
    pytest.importorskip("gunicorn")
    root = Path(__file__).resolve().parent.parent
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}",
         "--graceful-timeout", "20", "tests.audit_wsgi:application"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root),
             "DISTLOCK_AUDIT_DB": json.dumps(_sqlite_database())},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pids = set()
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lock/0", timeout=5) as r:
                    pids.add(r.read())
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "no gunicorn"
                time.sleep(0.2)
        for path in [f"lock/{i}" for i in range(1, 60)] + ["hold/0", "hold/1"]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=10) as r:
                pids.add(r.read())
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    finally:
        server.kill()
    assert server.returncode == 0, err
    rows = LockEvent.objects.filter(name__startswith="wsgi:")
    assert rows.filter(kind="released").count() == 60, err
    assert sorted(rows.filter(kind="acquired").values_list("name", flat=True)) == [
        "wsgi:hold:0", "wsgi:hold:1"
    ]
    assert set(rows.values_list("pid", flat=True)) == {int(pid) for pid in pids}


def test_a_database_that_never_answers_does_not_hold_the_exit() -> None:
    """The exit waits for the last write at most ``EXIT_TIMEOUT`` seconds (shortened to
    1 s in the process), then says how many events were lost."""
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": "127.0.0.1",
            "PORT": silent.getsockname()[1],
            "NAME": "nothing",
            "USER": "nobody",
        }
        started = time.monotonic()
        process = _run_exiting(database, "stuck")
        try:
            _, err = process.communicate(timeout=60)
        finally:
            process.kill()
        took = time.monotonic() - started
    assert process.returncode == 0, err
    assert took < audit_exit.STUCK_EXIT_TIMEOUT + 20, took
    lost = audit_exit.EVENTS + audit_exit.OPEN
    assert f"{lost} lock events" in err and "not written" in err
