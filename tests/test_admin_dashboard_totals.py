"""The held-locks page as an SRE reads it: totals per alias (exact, "at least", unknown
with the reason), readable backend names, "held for", previous and next pages, the
auto-refresh setting and the admin home's entry. Real locks on the test aliases."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from django_distlock import locks
from django_distlock.backends.base import HeldCount
from django_distlock.contrib.admin import views
from django_distlock.contrib.admin.operations import listing, totals
from django_distlock.handle import Lock

from .conftest import DATABASES, require_pg, require_redis, require_zookeeper
from .test_admin_dashboard import LIST, boss, staff_with  # noqa: F401  (fixture)

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]

GRAND = r'id="distlock-grand-total".*?count"[^>]*><strong>([^<]+)</strong>'
COUNTED = ["sqlite-lease", "pg-lease", "redis", "zk", "locmem"]


@pytest.fixture
def three_each() -> Iterator[dict[str, list[Lock]]]:
    """Three locks ``tot:<i>`` held on every alias that counts."""
    require_pg(), require_redis(), require_zookeeper()
    held: dict[str, list[Lock]] = {}
    for alias in COUNTED:
        held[alias] = [locks[alias].lock(f"tot:{i}", ttl=60, timeout=2) for i in range(3)]
        for handle in held[alias]:
            assert handle.acquire()
    yield held
    for handles in held.values():
        for handle in handles:
            if handle.held:
                handle.release()
    locks.close_all()


def totals_of(page: str) -> dict[str, tuple[str, str]]:
    """alias -> (data-exact, count text) of the page's totals table."""
    found = re.findall(
        r'<div class="distlock-total[^"]*" data-alias="([^"]+)" data-exact="(\w+)"[^>]*>.*?'
        r'<span class="distlock-total-count"[^>]*>([^<]*)</span>',
        page,
        re.S,
    )
    return {alias: (exact, text) for alias, exact, text in found}


def test_totals_are_exact_or_unknown_with_the_reason(
    boss: Client, three_each: dict[str, list[Lock]]  # noqa: F811
) -> None:
    page = boss.get(reverse(LIST), {"q": "tot:"}).content.decode()
    shown = totals_of(page)
    for alias in COUNTED:
        assert shown[alias] == ("yes", "3"), alias
    assert shown["pg-tx"] == ("unknown", "unknown")
    assert "a count would try the row of every name ever used" in page
    assert shown["sqlite-tx"] == ("unknown", "unknown")
    # Unknown aliases make the sum a floor, never a number that looks exact.
    grand = re.search(GRAND, page, re.S)
    assert grand is not None and grand.group(1) == f"at least {3 * len(COUNTED)}"
    one = boss.get(reverse(LIST), {"q": "tot:", "alias": "redis"}).content.decode()
    assert totals_of(one) == {"redis": ("yes", "3")}  # filtered: only its count is paid
    three_each["redis"][0].release()
    assert totals_of(boss.get(reverse(LIST), {"q": "tot:"}).content.decode())["redis"] == (
        "yes", "2")


def test_past_the_cap_a_total_says_at_least(
    boss: Client, three_each: dict[str, list[Lock]], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setattr(views, "COUNT_LIMIT", 2)
    shown = totals_of(boss.get(reverse(LIST), {"q": "tot:"}).content.decode())
    for alias in COUNTED:
        assert shown[alias] == ("floor", "at least 2"), alias
    for alias in COUNTED:
        assert locks[alias].count_held("tot:", 3) == HeldCount(3, True)
        low = locks[alias].count_held("tot:", 2)
        assert (low.count, low.exact) == (2, False)


def test_a_count_in_words() -> None:
    assert totals.describe(HeldCount(12_345, True)) == "12,345"
    assert totals.describe(HeldCount(10_000, False)) == "at least 10,000"
    assert totals.describe(HeldCount(3, False, 12)) == "at least 3, at most 12"


def test_a_server_down_is_an_unknown_total(boss: Client, settings: Any) -> None:  # noqa: F811
    down = {"BACKEND": "django_distlock.backends.redis.RedisBackend",
            "LOCATION": "redis://127.0.0.1:1/0"}
    with override_settings(DISTLOCK={**settings.DISTLOCK, "redis-down": down}):
        page = boss.get(reverse(LIST)).content.decode()
    assert totals_of(page)["redis-down"] == ("unknown", "unknown")
    assert re.search(r'data-alias="redis-down".*?failed: ', page, re.S)


def test_readable_backend_names(boss: Client, three_each: dict[str, list[Lock]]) -> None:  # noqa: F811
    page = boss.get(reverse(LIST), {"q": "tot:"}).content.decode()
    for cls, label in [
        ("LeaseBackend", "PostgreSQL (lease)"),
        ("SqliteLeaseBackend", "SQLite (lease)"),
        ("RedisBackend", "Redis"),
        ("ZooKeeperBackend", "ZooKeeper"),
        ("LocMemBackend", "locmem (this process)"),
    ]:
        assert f'<td class="distlock-backend" title="{cls}">{label}</td>' in page
    assert "<small>PostgreSQL (transaction)</small>" in page  # its total
    assert listing.backend_label(locks["redis-cluster"]) == "Redis Cluster"


def test_held_for_and_expiry_are_on_the_servers_clock(
    boss: Client, three_each: dict[str, list[Lock]]  # noqa: F811
) -> None:
    page = boss.get(reverse(LIST), {"q": "tot:", "alias": "pg-lease"}).content.decode()
    assert re.search(r'id="distlock-server-now" data-now="\d{4}-\d\d-\d\dT', page)
    held_for = re.findall(r'class="distlock-held-for" data-since="([^"]+)">([^<]+)<', page)
    assert len(held_for) == 3 and all(text == "0\xa0minutes" for _, text in held_for)
    left = re.findall(r'class="distlock-countdown" data-expires="[^"]+">([^<]+)<', page)
    assert left and all(text in ("1\xa0minute", "0\xa0minutes") for text in left)


def follow(client: Client, url: str, link: str) -> tuple[list[str], str | None]:
    """The names of the page at ``url`` and the URL of its ``link`` (next/prev) if any."""
    page = client.get(url).content.decode()
    names = re.findall(r'data-name="([^"]+)"', page)
    found = re.search(rf'id="distlock-{link}" href="([^"]+)"', page)
    return names, reverse(LIST) + found.group(1).replace("&amp;", "&") if found else None


def test_previous_and_next_pages_round_trip(
    boss: Client, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    handles = [locks["locmem"].lock(f"walk:{i}", ttl=60) for i in range(7)]
    for handle in handles:
        handle.acquire()
    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    try:
        forward: list[tuple[str, list[str]]] = []
        url: str | None = reverse(LIST) + "?alias=locmem&q=walk:&refresh=0"
        while url:
            names, next_url = follow(boss, url, "next")
            forward.append((url, names))
            url = next_url
        assert [n for _, page in forward for n in page] == [h.name for h in handles]
        assert len(forward) == 4
        # Back from the last page, page by page, to the first: the same pages.
        url = forward[-1][0]
        backward = []
        while url:
            names, url = follow(boss, url, "prev")
            backward.append(names)
        assert backward == [page for _, page in reversed(forward)]
        first = boss.get(forward[0][0]).content.decode()
        assert 'id="distlock-prev"' not in first and 'id="distlock-first"' not in first
        # The second page's "Previous" is the first page (no cursor); settings are kept.
        _, prev = follow(boss, forward[1][0], "prev")
        assert prev is not None
        args = parse_qs(urlparse(prev).query)
        assert "cursor" not in args and args["refresh"] == ["0"] and args["q"] == ["walk:"]
    finally:
        for handle in handles:
            handle.release()


def test_a_forged_or_foreign_trail_is_refused(boss: Client) -> None:  # noqa: F811
    assert boss.get(reverse(LIST), {"back": "forged"}).status_code == 400
    trail = listing.sign_trail([None], ("", "a:"))
    assert boss.get(reverse(LIST), {"q": "a:", "back": trail}).status_code == 200
    assert boss.get(reverse(LIST), {"q": "b:", "back": trail}).status_code == 400
    cursor = listing.sign_position(("locmem", None), ("", "a:"))
    assert boss.get(reverse(LIST), {"q": "a:", "back": cursor}).status_code == 400


def test_auto_refresh_setting(boss: Client) -> None:  # noqa: F811
    page = boss.get(reverse(LIST)).content.decode()
    assert 'id="distlock-refresh" data-seconds="10" data-param=""' in page
    assert "distlock_admin/autorefresh.js" in page
    off = boss.get(reverse(LIST), {"refresh": "0"}).content.decode()
    assert 'data-param="0"' in off and '<input type="hidden" name="refresh" value="0">' in off
    assert boss.get(reverse(LIST), {"refresh": "3"}).status_code == 400


def test_held_locks_is_on_the_admin_home(boss: Client) -> None:  # noqa: F811
    entry = reverse("admin:distlock_admin_heldlock_changelist")
    home = boss.get(reverse("admin:index")).content.decode()
    assert re.search(rf'<a href="{entry}"[^>]*>Held locks</a>', home)
    response = boss.get(entry)
    assert response.status_code == 302 and response["Location"] == reverse(LIST)
    viewer = staff_with("view_held_lock")
    assert f'href="{entry}"' in viewer.get(reverse("admin:index")).content.decode()
    assert viewer.get(entry).status_code == 302
    User.objects.filter(username="viewer").delete()
    nobody = staff_with()
    assert f'href="{entry}"' not in nobody.get(reverse("admin:index")).content.decode()
    assert nobody.get(entry).status_code == 403


def test_zookeeper_past_its_reads_is_at_least_and_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past COUNT_READS parents ZooKeeper counts those it read: at least, with the
    parents as the ceiling."""
    require_zookeeper()
    from django_distlock.backends.zookeeper import backend as zk

    handles = [locks["zk"].lock(f"zkc:{i}") for i in range(3)]
    for handle in handles:
        handle.acquire()
    try:
        assert locks["zk"].count_held("zkc:") == HeldCount(3, True)
        monkeypatch.setattr(zk, "COUNT_READS", 2)
        assert locks["zk"].count_held("zkc:") == HeldCount(2, False, 3)
    finally:
        for handle in handles:
            handle.release()


def test_redis_index_of_ended_leases_is_only_a_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ended leases keep their index entries: a count that runs out of its budget of
    entries says "at least" what it found and "at most" the entries, never more."""
    require_redis()
    import time

    from django_distlock.backends.redis import backend as redis_backend

    ended = [locks["redis"].lock(f"rdc:{c}", ttl=0.2) for c in "abc"]
    for handle in ended:
        handle.acquire()
    live = locks["redis"].lock("rdc:d", ttl=60)
    live.acquire()
    time.sleep(0.4)
    try:
        assert locks["redis"].count_held("rdc:") == HeldCount(1, True)  # every entry read
        monkeypatch.setattr(redis_backend, "LIST_BUDGET", 0)
        assert locks["redis"].count_held("rdc:", limit=2) == HeldCount(0, False, 4)
    finally:
        live.release()


def test_an_alias_configured_alike_is_counted_once(boss: Client, settings: Any) -> None:  # noqa: F811
    again = {**settings.DISTLOCK, "locmem-again": settings.DISTLOCK["locmem"]}
    with override_settings(DISTLOCK=again):
        handle = locks["locmem"].lock("same:1", ttl=60)
        handle.acquire()
        try:
            page = boss.get(reverse(LIST), {"q": "same:"}).content.decode()
        finally:
            handle.release()
    shown = totals_of(page)
    assert shown["locmem"] == ("yes", "1") and shown["locmem-again"] == ("yes", "1")
    assert "the same locks as locmem (configured alike" in page
    grand = re.search(GRAND, page, re.S)
    assert grand is not None and grand.group(1) == "at least 1"  # unknown ones: a floor


def root_reads(backend: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ``getChildren`` of ``ROOT`` (every lock parent's name) that the ZooKeeper
    ``backend``'s kazoo client sends from now on, as it sends them."""
    root, kazoo = backend.settings.root, backend.client.get()
    sent: list[str] = []
    real = kazoo._call

    def call(request: Any, result: Any) -> Any:
        if type(request).__name__.startswith("GetChildren") and request.path == root:
            sent.append(request.path)
        return real(request, result)

    monkeypatch.setattr(kazoo, "_call", call)
    return sent


def test_one_zookeeper_page_view_reads_the_lock_parents_once(
    boss: Client, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """The page and its count share one read of ROOT's children (every lock parent's
    name, 67 ms at 100,000 locks): counted at the kazoo client, as the requests sent;
    the API outside a page view still reads them on every call."""
    require_zookeeper()
    backend = locks["zk"]
    handles = [backend.lock(f"once:{i}") for i in range(3)]
    for handle in handles:
        assert handle.acquire(timeout=5)
    sent = root_reads(backend, monkeypatch)
    try:
        for query in ({"alias": "zk", "q": "once:"}, {"alias": "zk"}):
            sent.clear()
            page = boss.get(reverse(LIST), query).content.decode()
            assert "once:2" in page and totals_of(page)["zk"][1] != "unknown"
            assert len(sent) == 1, query
        sent.clear()
        assert [i.name for i in backend.held_locks(prefix="once:")] == [
            f"once:{i}" for i in range(3)]
        assert backend.count_held(prefix="once:") == HeldCount(3, True)
        assert len(sent) == 2
    finally:
        for handle in handles:
            handle.release()
