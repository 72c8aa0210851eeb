"""The activity page: charts and percentiles of the audit trail over a window."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_distlock.dashboard.activity import name_prefix, percentile
from django_distlock.models import LockEvent

pytestmark = pytest.mark.django_db

URL = "admin:django_distlock_activity"


@pytest.fixture
def boss() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    return client


def event(
    minutes_ago: float, kind: str, alias: str = "default", name: str = "order:1", **kw: float
) -> None:
    at = timezone.now() - timedelta(minutes=minutes_ago)
    LockEvent.objects.create(at=at, kind=kind, alias=alias, name=name, **kw)


def chart_values(page: str, title: str) -> list[str]:
    svg = re.search(
        rf'<svg class="distlock-chart" role="img" aria-label="{title}".*?</svg>', page, re.S
    )
    assert svg, title
    return re.findall(r'data-value="([^"]+)"', svg.group(0))


def test_percentile_and_prefix() -> None:
    assert percentile([], 0.5) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert name_prefix("order:42:x") == "order:" and name_prefix("plain") == "plain"


def test_charts_count_the_events_of_the_window(boss: Client) -> None:
    for waited in (0.01, 0.02, 0.03, 1.0):
        event(10, "acquired", waited=waited)
    event(10, "released", held=0.5)
    event(5, "failed", waited=2.0)
    event(5, "lost", alias="redis", name="report:9", held=30.0)
    event(3, "force_released", alias="redis", name="report:9")
    event(60 * 30, "acquired")  # outside the 24h window
    page = boss.get(reverse(URL)).content.decode()
    acquisitions = chart_values(page, "Acquisitions")
    assert len(acquisitions) == 96 and sum(int(v) for v in acquisitions) == 4
    assert sum(int(v) for v in chart_values(page, "Timeouts / busy")) == 1
    assert sum(int(v) for v in chart_values(page, "Expired or lost leases")) == 1
    assert sum(int(v) for v in chart_values(page, "Force releases")) == 1
    assert chart_values(page, "Wait p95 per alias and name prefix")[0] == "1000"
    row = re.search(r'data-alias="default" data-prefix="order:">(.*?)</tr>', page, re.S)
    assert (
        row and "0.020 / 1.000 / 1.000" in row.group(1) and "0.500 / 0.500 / 0.500" in row.group(1)
    )
    only = boss.get(reverse(URL), {"alias": "redis", "window": "1h"}).content.decode()
    assert 'data-alias="default"' not in only and 'data-prefix="report:"' in only
    assert 'data-alias="redis"' in boss.get(reverse(URL), {"q": "report:"}).content.decode()


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
