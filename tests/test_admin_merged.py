"""The merged view of the held-locks page ("All aliases" by age): real locks on the
PostgreSQL and SQLite lease aliases, merged held longest first and expiring soonest
first, page after page and back; the aliases that cannot order by age said so; each
page one indexed read per alias (the plans, with 20,000 held rows)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.urls import reverse

from django_distlock import locks
from django_distlock.backends.database.ordered import age_statement
from django_distlock.backends.database.sql import upper_bound
from django_distlock.contrib.admin import views
from django_distlock.contrib.admin.operations.ordered import order_reason, read_merged
from django_distlock.handle import Lock

from .conftest import DATABASES, require_pg, require_redis

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]

MERGED = ["pg-lease", "sqlite-lease"]
COUNT = 7
LIST = "admin:django_distlock_held_locks"


@pytest.fixture
def spread() -> Iterator[list[tuple[str, str]]]:
    """``COUNT`` locks taken in turn on pg-lease and sqlite-lease, 20 ms apart, each
    with a shorter TTL than the one before (so expiring soonest is the reverse order);
    a lock on locmem and Redis besides. Yields (alias, name) in acquisition order."""
    require_pg()
    require_redis()
    handles: list[Lock] = []
    order: list[tuple[str, str]] = []
    for i in range(COUNT):
        alias = MERGED[i % 2]
        handle = locks[alias].lock(f"merge:{i}", ttl=120 - 10 * i, timeout=2)
        assert handle.acquire()
        handles.append(handle)
        order.append((alias, f"merge:{i}"))
        time.sleep(0.02)
    for alias in ("locmem", "redis"):
        handle = locks[alias].lock("merge:other", ttl=60, timeout=2)
        assert handle.acquire()
        handles.append(handle)
    yield order
    for handle in handles:
        if handle.held:
            handle.release()
    locks.close_all()


def _walk(order: str, limit: int) -> list[tuple[str, str]]:
    """Every page of the merge from the start, as (alias, name)."""
    seen: list[tuple[str, str]] = []
    position = None
    for _ in range(COUNT + 2):
        page = read_merged([*MERGED, "locmem", "redis"], "merge:", order, limit, position)
        seen += [(row.info.alias, row.info.name) for row in page.rows]
        assert len(page.rows) <= limit
        if page.next_position is None:
            return seen
        position = page.next_position
    raise AssertionError(f"the pages never ended: {seen}")


@pytest.mark.parametrize("limit", [1, 2, 3, COUNT])
def test_the_merge_is_in_age_order_page_after_page(
    spread: list[tuple[str, str]], limit: int
) -> None:
    assert _walk("acquired", limit) == spread
    assert _walk("expires", limit) == spread[::-1]


def test_the_aliases_that_cannot_order_are_left_out_with_their_reason(
    spread: list[tuple[str, str]],
) -> None:
    page = read_merged([*MERGED, "locmem", "redis", "sqlite-tx"], "merge:", "acquired", 50)
    assert {row.info.alias for row in page.rows} == set(MERGED)
    left = {alias: reason for alias, _, reason in page.left_out}
    assert set(left) == {"locmem", "redis"}  # sqlite-tx cannot list at all: its own banner
    assert "name order" in left["redis"] and left["redis"] == order_reason(locks["redis"])
    assert order_reason(locks["sqlite-tx"]).startswith("a lock held in transaction mode")
    assert order_reason(locks["pg-lease"]) == ""


def _rows(html: str) -> list[tuple[str, str]]:
    return [
        (unescape(a), unescape(n))
        for a, n in re.findall(r'class="distlock-row" data-alias="([^"]*)" data-name="([^"]*)"',
                               html)
    ]


def _link(html: str, element_id: str) -> str | None:
    found = re.search(rf'id="{element_id}" href="([^"]*)"', html)
    return unescape(found.group(1)) if found else None


def test_the_page_pages_forth_and_back_in_the_merged_order(
    spread: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "PAGE_SIZE", 3)
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "b@example.com", "pw"))
    url = reverse(LIST)
    answer = client.get(url, {"q": "merge:", "by": "acquired", "refresh": "0"})
    assert answer.status_code == 200
    html = answer.content.decode()
    assert re.search(r'class="warning distlock-left-out" data-aliases="[^"]*\bredis\b', html)
    pages = [_rows(html)]
    while (nxt := _link(html, "distlock-next")) is not None:
        html = client.get(url + nxt).content.decode()
        pages.append(_rows(html))
    assert [row for page in pages for row in page] == spread
    assert [len(page) for page in pages] == [3, 3, 1]
    for expected in pages[-2::-1]:  # back to the first page
        prev = _link(html, "distlock-prev")
        assert prev is not None
        html = client.get(url + prev).content.decode()
        assert _rows(html) == expected
    assert _link(html, "distlock-prev") is None
    # A page link of one order is refused under another, and a forged one.
    nxt = _link(html, "distlock-next")
    assert nxt is not None
    assert client.get(url + nxt.replace("by=acquired", "by=expires")).status_code == 400
    assert client.get(url, {"by": "acquired", "cursor": "forged"}).status_code == 400
    assert client.get(url, {"by": "oldest"}).status_code == 400


def _seed(alias: str, vendor: str, rows: int) -> None:
    """``rows`` held leases written directly, acquired 1 ms apart, expiring in an hour."""
    with connections[alias].cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(
                "INSERT INTO django_distlock_lock (name, owner, fencing, acquired_at,"
                " expires_at, host, pid, thread) SELECT 'l:scale:' || g, 'o' || g, 1,"
                " now() - g * interval '1 ms', now() + interval '1 hour' + g * interval '1 ms',"
                " 'h', 1, 't' FROM generate_series(1, %s) g", [rows])
            cursor.execute("ANALYZE django_distlock_lock")
        else:
            cursor.execute(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s)"
                " INSERT INTO django_distlock_lock (name, owner, fencing, acquired_at,"
                " expires_at, host, pid, thread) SELECT 'l:scale:' || n, 'o' || n, 1,"
                " strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || n || ' seconds'),"
                " strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || (3600 + n) || ' seconds'),"
                " 'h', 1, 't' FROM g", [rows])
            cursor.execute("ANALYZE")


def _node_names(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _node_names(child)


@pytest.mark.parametrize("order", ["acquired", "expires"])
def test_a_page_is_one_index_range_on_postgresql(order: str) -> None:
    """With 20,000 held rows, a page of 50 reads 50 index entries: no sort, no scan."""
    require_pg()
    _seed("pg", "postgresql", 20_000)
    low = "l:"
    with connections["pg"].cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + age_statement("postgresql", order),
            [low, upper_bound(low), "-infinity", "", 50],
        )
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    nodes = list(_node_names(plan[0]["Plan"]))
    kinds = [node["Node Type"] for node in nodes]
    assert "Sort" not in kinds and "Seq Scan" not in kinds, kinds
    scans = [node for node in nodes if node.get("Index Name")]
    assert [node["Index Name"] for node in scans] == [f"distlock_held_{order}_idx"]
    assert scans[0]["Actual Rows"] == 50


@pytest.mark.parametrize("order", ["acquired", "expires"])
def test_a_page_is_one_index_range_on_sqlite(order: str) -> None:
    _seed("default", "sqlite", 20_000)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "EXPLAIN QUERY PLAN " + age_statement("sqlite", order),
            ["l:", upper_bound("l:"), "", "", 50],
        )
        plan = " / ".join(str(row[-1]) for row in cursor.fetchall())
    assert f"distlock_held_{order}_idx" in plan and "TEMP B-TREE" not in plan, plan


def test_bad_arguments_are_refused_before_any_call() -> None:
    backend = locks["sqlite-lease"]
    for order, cursor in (("oldest", None), ("acquired", "not json"), ("expires", "[1, 2]"),
                          ("acquired", '["a"]')):
        with pytest.raises(ValueError):
            backend.held_locks_by_age(order, "", 10, cursor)
    with pytest.raises(ValueError):
        read_merged(MERGED, "", "held", 10)


def test_a_page_view_reads_each_merged_alias_once(
    spread: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of the merged view asks each merged alias for one page, of the page's size
    (and no alias left out is read for it)."""
    from django_distlock.backends.database.lease import LeaseBackend

    calls: list[tuple[str, int]] = []
    real = LeaseBackend.held_locks_by_age

    def spy(self: Any, order: str, prefix: str = "", limit: int = 50,
            cursor: str | None = None) -> Any:
        calls.append((self.alias, limit))
        return real(self, order, prefix, limit, cursor)

    monkeypatch.setattr(LeaseBackend, "held_locks_by_age", spy)
    monkeypatch.setattr(views, "PAGE_SIZE", 3)
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "b@example.com", "pw"))
    answer = client.get(reverse(LIST), {"q": "merge:", "by": "expires"})
    assert answer.status_code == 200 and len(_rows(answer.content.decode())) == 3
    merged = [a for a in locks if getattr(locks[a], "supports_age_order", False)]
    assert sorted(calls) == sorted((alias, 3) for alias in merged)
