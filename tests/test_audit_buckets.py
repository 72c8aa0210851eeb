"""The activity buckets and the purge of the audit trail, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_distlock.contrib.audit import buckets
from django_distlock.contrib.audit.models import LockActivity, LockEvent
from django_distlock.contrib.audit.purge import purge
from django_distlock.contrib.audit.recorder import write_event
from django_distlock.contrib.audit.tasks import purge_audit

from .conftest import DATABASES, require_pg

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]


@pytest.fixture(params=DATABASES)
def database(request: pytest.FixtureRequest) -> str:
    if request.param == "pg":
        require_pg()
    return str(request.param)


def _hold(at: Any, name: str = "order:1", alias: str = "a") -> dict[str, Any]:
    return {
        "at": at, "kind": "released", "alias": alias, "name": name,
        "acquired_at": at - timedelta(seconds=0.5), "waited": 0.01, "held": 0.5,
    }  # fmt: skip


def test_writers_at_once_lose_no_count(database: str) -> None:
    """Four threads add 10 batches each to the same rows: the counts add up (the rows
    are inserted once, then read locked and updated)."""
    # 30 s into a minute: a hold of 0.5 s then lies in one bucket of every span (at
    # 0.5 s past a minute it spanned two minutes, and the rows were 10, not 8)
    at = timezone.now().replace(second=30, microsecond=0) - timedelta(minutes=1)
    batch = [_hold(at), _hold(at, "report:1"), {**_hold(at), "kind": "lost"}]
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(10):
                buckets.add_events(batch, using=database)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    rows = LockActivity.objects.using(database)
    assert rows.count() == 2 * len(buckets.SPANS)
    for span in buckets.SPANS:
        order = rows.get(span=span, prefix="order:")
        assert (order.acquired, order.lost) == (80, 40)
        assert order.holds == {buckets.slot(0.5): 80}
        assert order.waits == {buckets.slot(0.01): 80}
        assert rows.get(span=span, prefix="report:").acquired == 40


def test_bucket_starts_align_on_the_span() -> None:
    at = timezone.now().replace(minute=37, second=12, microsecond=5)
    assert buckets.bucket_start(at, 60) == at.replace(second=0, microsecond=0)
    assert buckets.bucket_start(at, 900) == at.replace(minute=30, second=0, microsecond=0)
    assert buckets.bucket_start(at, 7200).hour % 2 == 0


def _trail(now: Any) -> None:
    for days in (1, 40):
        write_event(**_hold(now - timedelta(days=days), alias="default"))
    write_event(
        at=now - timedelta(days=40), kind="force_released", alias="default", name="n",
        actor="boss", reason="stuck",
    )  # fmt: skip


def test_a_routine_purge_keeps_force_releases_and_is_recorded() -> None:
    now = timezone.now()
    _trail(now)
    assert purge(0, actor="command:ops") == 2  # --days 0: every hold, not the force release
    kinds = sorted(LockEvent.objects.values_list("kind", flat=True))
    assert kinds == ["force_released", "purged"]
    record = LockEvent.objects.get(kind="purged")
    assert record.actor == "command:ops" and "deleted 2 rows" in record.reason
    assert abs((record.at - timezone.now()).total_seconds()) < 60
    assert not LockActivity.objects.filter(alias="default").exists()  # their buckets too
    assert purge(0) == 0 and LockEvent.objects.filter(kind="purged").count() == 1
    # Only the explicit option deletes the operators' actions (and says so).
    assert purge(0, operator_actions=True, actor="command:ops") == 2
    assert "force releases and purges included" in LockEvent.objects.get().reason


def test_a_purge_keeps_short_buckets_only_as_long_as_their_window() -> None:
    now = timezone.now()
    buckets.add_events([_hold(now - timedelta(hours=3))])
    assert purge(now=now) == 0
    spans = set(LockActivity.objects.values_list("span", flat=True))
    assert spans == {300, 900, 7200}  # the minutes are the last hour's window only


def test_retention_per_alias_keeps_the_recent(settings: Any) -> None:
    now = timezone.now()
    _trail(now)
    audited = {**settings.DISTLOCK["default"], "AUDIT": {"RETENTION_DAYS": 7}}
    with override_settings(DISTLOCK={**settings.DISTLOCK, "default": audited}):
        assert purge() == 1  # the hold of 40 days ago
    left = set(LockEvent.objects.values_list("kind", "at"))
    assert ("released", now - timedelta(days=1)) in left
    assert {kind for kind, _ in left} == {"released", "force_released", "purged"}


def test_the_command_and_the_celery_task_purge_as_cron_and_beat_would(capsys: Any) -> None:
    now = timezone.now()
    _trail(now)
    call_command("distlock_audit", "purge")  # 30 days: default does not audit
    assert "Deleted 1 audit rows." in capsys.readouterr().out
    assert LockEvent.objects.get(kind="purged").actor.startswith("command:")
    _trail(now)
    assert purge_audit.apply(kwargs={"days": 0}).get() == 3  # the holds left and new
    assert LockEvent.objects.filter(kind="purged", actor="task:purge_audit").exists()
    call_command("distlock_audit", "purge", "--days", "0", "--operator-actions")
    assert list(LockEvent.objects.values_list("kind", flat=True)) == ["purged"]


class _ToDatabase:
    """Route the app's models to one database."""

    def __init__(self, database: str) -> None:
        self.database = database

    def _route(self, model: Any, **hints: Any) -> str | None:
        return self.database if model._meta.app_label == "distlock_audit" else None

    db_for_read = db_for_write = _route


def test_a_purge_is_one_transaction_on_the_audit_database(database: str) -> None:
    """With the audit tables routed to another database than ``default``, a purge's
    deletes and its ``purged`` row are still one transaction there (all or nothing)."""
    now = timezone.now()
    with override_settings(DATABASE_ROUTERS=[_ToDatabase(database)]):
        _trail(now)
        buckets.add_events([_hold(now - timedelta(hours=3))])
        with CaptureQueriesContext(connections[database]) as seen:
            assert purge(0, now=now, actor="command:ops") == 2
        kinds = sorted(LockEvent.objects.values_list("kind", flat=True))
    assert kinds == ["force_released", "purged"]
    statements = [q["sql"].split()[0].upper() for q in seen.captured_queries]
    assert statements.count("BEGIN") <= 1 and statements.count("COMMIT") <= 1, statements
    assert statements.count("DELETE") >= 2 and "INSERT" in statements
    if connections[database].vendor == "postgresql":
        assert statements[0] == "BEGIN" and statements[-1] == "COMMIT", statements
