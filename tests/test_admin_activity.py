"""The activity page: charts and percentiles of the audit trail over a window."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_distlock.contrib.audit import buckets
from django_distlock.contrib.audit.activity import SHOWN, from_buckets
from django_distlock.contrib.audit.models import LockActivity
from django_distlock.contrib.audit.recorder import write_event

from .conftest import DATABASES, require_pg

pytestmark = [pytest.mark.django_versions, pytest.mark.django_db]

URL = "admin:django_distlock_activity"


@pytest.fixture
def boss() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    return client


def event(
    minutes_ago: float, kind: str, alias: str = "default", name: str = "order:1", **kw: float
) -> None:
    """One event written as the recorder writes it (a hold: at its end, with its start),
    30 s into its minute: a hold that spans a minute's end has rows in both minutes."""
    at = (timezone.now() - timedelta(minutes=minutes_ago)).replace(second=30, microsecond=0)
    if kind in ("released", "lost"):
        kw.setdefault("held", 0.0)
        kw["acquired_at"] = at - timedelta(seconds=kw["held"])  # type: ignore[assignment]
    write_event(at=at, kind=kind, alias=alias, name=name, **kw)


def chart_values(page: str, title: str) -> list[str]:
    svg = re.search(
        rf'<svg class="distlock-chart" role="img" aria-label="{title}".*?</svg>', page, re.S
    )
    assert svg, title
    return re.findall(r'data-value="([^"]+)"', svg.group(0))


def test_name_prefix() -> None:
    assert buckets.name_prefix("order:42:x") == "order:"
    assert buckets.name_prefix("plain") == "plain"


def bound(value: float) -> str:
    """How the page shows ``value`` seconds: its histogram bucket's upper bound."""
    return f"{buckets.BOUNDS[int(buckets.slot(value))]:.3f}"


def test_percentile_of_a_histogram() -> None:
    assert buckets.percentile({}, 0.5) is None
    histogram = {buckets.slot(v): 1 for v in (0.001, 0.1, 10.0)}
    assert buckets.percentile(histogram, 0.5) == buckets.BOUNDS[int(buckets.slot(0.1))]
    assert 0.1 <= buckets.percentile(histogram, 0.5) < 0.1 * 1.42  # type: ignore[operator]
    assert buckets.percentile({"999": 1}, 0.5) == buckets.BOUNDS[-1]  # past the last bound


def test_charts_count_the_holds_of_the_window(boss: Client) -> None:
    for waited in (0.01, 0.02, 0.03, 1.0):  # four holds of 0.5 s, one row each
        event(10, "released", waited=waited, held=0.5)
    event(5, "failed", waited=2.0)
    event(5, "lost", alias="redis", name="report:9", held=30.0)
    event(3, "force_released", alias="redis", name="report:9")
    event(20, "acquired", waited=0.01)  # a hold its process left open at exit
    event(60 * 30, "released", held=1.0)  # outside the 24h window
    page = boss.get(reverse(URL)).content.decode()
    acquisitions = chart_values(page, "Acquisitions")
    assert len(acquisitions) == 96 and sum(int(v) for v in acquisitions) == 6
    assert sum(int(v) for v in chart_values(page, "Timeouts / busy")) == 1
    assert sum(int(v) for v in chart_values(page, "Expired or lost leases")) == 1
    assert sum(int(v) for v in chart_values(page, "Force releases")) == 1
    wait_p95 = chart_values(page, "Wait p95 per alias and name prefix")[0]
    assert wait_p95 == f"{float(bound(1.0)) * 1000:.0f}"
    row = re.search(r'data-alias="default" data-prefix="order:">(.*?)</tr>', page, re.S)
    assert row, page
    waits = f"{bound(0.02)} / {bound(1.0)} / {bound(1.0)}"
    holds = f"{bound(0.5)} / {bound(0.5)} / {bound(0.5)}"
    assert waits in row.group(1) and holds in row.group(1), row.group(1)
    only = boss.get(reverse(URL), {"alias": "redis", "window": "1h"}).content.decode()
    assert 'data-alias="default"' not in only and 'data-prefix="report:"' in only
    assert 'data-alias="redis"' in boss.get(reverse(URL), {"q": "report:"}).content.decode()
    assert 'data-alias="redis"' in boss.get(reverse(URL), {"q": "rep"}).content.decode()
    # Past the first ":" the buckets cannot tell: the page counts the events themselves.
    deep = boss.get(reverse(URL), {"q": "report:9"}).content.decode()
    assert 'data-alias="redis"' in deep and 'data-alias="default"' not in deep
    assert sum(int(v) for v in chart_values(deep, "Force releases")) == 1
    assert 'data-alias="redis"' not in boss.get(reverse(URL), {"q": "report:8"}).content.decode()


@pytest.mark.parametrize("window", ["1h", "6h", "24h", "7d"])
def test_every_window_reads_only_its_buckets(boss: Client, window: str) -> None:
    event(90, "released", waited=0.1, held=0.2)  # in every window but the last hour
    assert LockActivity.objects.count() == len(buckets.SPANS)
    page = boss.get(reverse(URL), {"window": window}).content.decode()
    assert sum(int(v) for v in chart_values(page, "Acquisitions")) == (window != "1h")


def test_rows_before_the_upgrade_count_once() -> None:
    """A row of 0009's trail: its ``acquired`` counts the acquisition, its ``released``
    (no ``acquired_at``) only the hold."""
    at = timezone.now()
    rows = [
        {"at": at, "kind": "acquired", "alias": "a", "name": "n", "waited": 0.1},
        {"at": at, "kind": "released", "alias": "a", "name": "n", "held": 0.2},
    ]
    (counts, *_) = [c for k, c in buckets.collect(rows).items() if k[0] == 60]
    assert (counts.acquired, sum(counts.waits.values()), sum(counts.holds.values())) == (1, 1, 1)


@pytest.mark.parametrize("query", [{"window": "2y"}, {"q": "a\x00"}, {"alias": "x" * 101}])
def test_bad_arguments_are_400(boss: Client, query: dict[str, str]) -> None:
    assert boss.get(reverse(URL), query).status_code == 400


def test_permissions() -> None:
    staff = User.objects.create_user("s", "s@example.com", "pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get(reverse(URL)).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_held_lock"))
    assert client.get(reverse(URL)).status_code == 200
    client.force_login(User.objects.create_user("joe", "j@example.com", "pw"))
    assert client.get(reverse(URL)).status_code == 302


class ToDatabase:
    """Route the app's models to one database (the activity page reads it)."""

    def __init__(self, database: str) -> None:
        self.database = database

    def _route(self, model: Any, **hints: Any) -> str | None:
        return self.database if model._meta.app_label == "distlock_audit" else None

    db_for_read = db_for_write = _route


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("database", DATABASES)
def test_the_histograms_read_are_the_shown_groups_only(database: str) -> None:
    """Summing a histogram expands every slot of every row read (the 7-day window of
    4 aliases and 20 prefixes at 1,000,000 events: 6,720 rows of about 16 slots, most
    of the page's time): the page shows the percentiles of the SHOWN busiest groups and
    reads only their rows' histograms; every group is still counted."""
    if database == "pg":
        require_pg()
    at = timezone.now().replace(second=30, microsecond=0) - timedelta(minutes=2)
    groups = SHOWN + 3
    events = [
        {"at": at, "kind": "released", "alias": "a", "name": f"p{group:02d}:1",
         "acquired_at": at - timedelta(seconds=0.5), "waited": 0.01 * (1 + group % 3),
         "held": 0.5}
        for group in range(groups) for _ in range(group + 1)
    ]  # fmt: skip
    buckets.add_events(events, using=database)
    since = buckets.bucket_start(timezone.now(), 60) + timedelta(seconds=60) - timedelta(hours=1)
    with (
        override_settings(DATABASE_ROUTERS=[ToDatabase(database)]),
        CaptureQueriesContext(connections[database]) as seen,
    ):
        series, found = from_buckets(60, since, 60, "", "")
    assert len(seen.captured_queries) == 4
    assert sum(series["acquired"]) == len(events)  # every group counted
    assert [g.prefix for g in found] == [f"p{group:02d}:" for group in reversed(range(groups))]
    for group in found[:SHOWN]:
        assert sum(group.holds.values()) == sum(group.waits.values()) == group.counts["acquired"]
        assert group.holds == {buckets.slot(0.5): group.counts["acquired"]}
    for group in found[SHOWN:]:  # not shown: their histograms were not read
        assert group.counts["acquired"] >= 1 and group.waits == group.holds == {}
