"""The audit trail's recorder: lock events queued by signal receivers, written off the hot path."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_distlock import locks
from django_distlock.auditing import AuditSettings, parse_audit
from django_distlock.dashboard import recorder as recorder_module
from django_distlock.dashboard.recorder import Recorder, recorded_elsewhere, recorder
from django_distlock.exceptions import InvalidBackendOptions
from django_distlock.models import LockEvent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def audited(settings: Any) -> Iterator[None]:
    """locmem audited fully, "locmem-sampled" at 0; the queue emptied before and after."""
    base = settings.DISTLOCK["locmem"]
    recorder.flush()
    LockEvent.objects.all().delete()
    with override_settings(
        DISTLOCK={
            **settings.DISTLOCK,
            "locmem": {**base, "AUDIT": True},
            "locmem-none": {**base, "AUDIT": {"SAMPLE": 0}},
        }
    ):
        yield
    recorder.flush()


def test_acquire_release_and_failure_are_recorded_with_durations(audited: None) -> None:
    handle = locks["locmem"].lock("audit:a", ttl=30)
    handle.acquire()
    owner = handle.owner_id
    assert not locks["locmem"].lock("audit:a", blocking=False).acquire()
    handle.release()
    recorder.flush()
    events = list(LockEvent.objects.order_by("id").values_list("kind", "name"))
    assert events == [("acquired", "audit:a"), ("failed", "audit:a"), ("released", "audit:a")]
    acquired, failed, released = LockEvent.objects.order_by("id")
    assert acquired.waited is not None and acquired.waited >= 0
    assert failed.waited is not None
    assert released.held is not None and released.held >= 0
    assert acquired.host == handle.host and acquired.pid == handle.pid
    assert acquired.owner == owner and released.host == handle.host
    assert released.owner == owner and failed.owner != owner


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
            if LockEvent.objects.filter(name="audit:b").count() == 2:
                break
            time.sleep(0.05)
        assert LockEvent.objects.filter(name="audit:b").count() == 2
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


def test_a_failed_write_drops_and_counts(audited: None) -> None:
    small = Recorder(capacity=10, interval=3600)
    small.add({"no_such_field": 1})
    assert small.flush() == 0 and small.dropped == 1


def test_force_release_is_recorded_unless_written_elsewhere(audited: None) -> None:
    locks["locmem"].lock("audit:d", ttl=30).acquire()
    with recorded_elsewhere():
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
