"""The held-locks pages of the admin, through the test client, with real locks held.

Locks are held on every listing alias of the test settings (SQLite and
PostgreSQL leases, locmem, Redis); the transaction-mode SQLite alias cannot
list and must say so.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connections
from django.test import Client, override_settings
from django.urls import reverse

from django_distlock import holder_context, locks
from django_distlock.contrib.admin import views
from django_distlock.contrib.admin.operations import listing
from django_distlock.contrib.audit.models import LockEvent
from django_distlock.contrib.audit.recorder import NOT_FREED
from django_distlock.handle import Lock, hold_of

from .conftest import (
    DATABASES,
    PG_ALIASES,
    REDIS_ALIASES,
    ZK_ALIASES,
    psycopg_params,
    require_mysql,
    require_pg,
    require_redis,
    require_zookeeper,
)

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]

LIST = "admin:django_distlock_held_locks"
DETAIL = "admin:django_distlock_held_lock"
RELEASE = "admin:django_distlock_force_release"


def listing_aliases() -> list[str]:
    return [a for a in locks if locks[a].supports_listing]


@pytest.fixture
def held() -> Iterator[dict[str, Lock]]:
    """One lock ``dash:<alias>`` held on every alias that lists."""
    handles = {}
    for alias in listing_aliases():
        handle = locks[alias].lock(f"dash:{alias}", ttl=60, timeout=2)
        handle.acquire()
        handles[alias] = handle
    yield handles
    for alias, handle in handles.items():
        if handle.held:
            try:
                handle.release()
            except Exception:
                locks[alias].force_release(handle.name)
    locks.close_all()  # the sessions of the backends the live server's thread built


@pytest.fixture
def boss() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    return client


def staff_with(*codenames: str) -> Client:
    user = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def test_lists_the_locks_of_every_listing_alias(boss: Client, held: dict[str, Lock]) -> None:
    assert {"default", "locmem"} <= set(held)
    response = boss.get(reverse(LIST), {"q": "dash:"})
    assert response.status_code == 200
    page = response.content.decode()
    for alias, handle in held.items():
        assert f'data-alias="{alias}" data-name="dash:{alias}"' in page
        if lists_owner(alias):
            assert f"owner {handle.owner_id}" in page
        assert hold_of(handle).acquisition.token not in page  # type: ignore[union-attr]
    assert "sqlite-tx (SQLite (transaction)) cannot list its locks." in page
    assert "distlock-countdown" in page and "distlock_admin/countdown.js" in page


def lists_owner(alias: str) -> bool:
    """Whether the alias' listing shows a holder's owner id: not transaction mode's (a row
    lock has none), nor MySQL session mode's (it would be a write per grant)."""
    backend = locks[alias]
    kind = listing.lock_kind(backend)
    return kind != "transaction" and not (
        kind == "session" and getattr(backend, "vendor", "") == "mysql")


def test_a_holder_listed_without_owner_id_is_told_apart_by_who_and_when(
    boss: Client, unique: Any,
) -> None:
    """MySQL session mode lists no owner id: the confirmation page keeps who holds and
    since when, so a lock released and taken again since the page was shown, even by the
    same thread, is not freed (409); the holder the page shows is. (Grants less than
    ``SAME_GRANT_WITHIN`` apart are not told apart: the first is held longer here.)"""
    require_mysql()
    alias, name = "mysql-session", unique("dash-noowner")
    first = locks[alias].lock(name)
    assert first.acquire()
    time.sleep(views.SAME_GRANT_WITHIN + 0.2)
    form = confirm(boss, alias, name)
    assert "owner" not in form and form["holder"] and form["acquired_at"]  # no value: none
    first.release()
    again = locks[alias].lock(name)
    assert again.acquire()
    try:
        response = boss.post(reverse(RELEASE), {**form, "reason": "stuck"})
        assert response.status_code == 409
        assert "held now by another holder" in response.content.decode()
        again.extend()  # still its holder
        assert not LockEvent.objects.exists()
        form = confirm(boss, alias, name)
        response = boss.post(reverse(RELEASE), {**form, "reason": "stuck"})
        assert response.status_code == 302
        assert not locks[alias].is_locked(name)
    finally:
        with contextlib.suppress(Exception):
            again.release()


def test_owner_tokens_are_never_shown(boss: Client, held: dict[str, Lock]) -> None:
    tokens = [hold_of(h).acquisition.token for h in held.values()]  # type: ignore[union-attr]
    assert all(len(t) == 32 for t in tokens)
    for url in [reverse(LIST)] + [f"{reverse(DETAIL)}?alias={a}&name=dash:{a}" for a in held]:
        page = boss.get(url).content.decode()
        assert not any(token in page for token in tokens)


def test_filter_by_alias_and_search_by_prefix(boss: Client, held: dict[str, Lock]) -> None:
    page = boss.get(reverse(LIST), {"alias": "locmem"}).content.decode()
    assert 'data-name="dash:locmem"' in page and 'data-name="dash:default"' not in page
    page = boss.get(reverse(LIST), {"q": "dash:loc"}).content.decode()
    assert 'data-name="dash:locmem"' in page and 'data-name="dash:default"' not in page
    page = boss.get(reverse(LIST), {"q": "nothing-here:"}).content.decode()
    assert "No lock held" in page


def test_pages_walk_every_alias_with_the_backends_cursors(
    boss: Client, held: dict[str, Lock], monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = [locks["default"].lock(f"dash:default:{i}", ttl=60) for i in range(3)]
    for handle in extra:
        handle.acquire()
    limits: list[int] = []
    real = type(locks["default"]).held_locks

    def spy(self: Any, prefix: str = "", limit: int = 50, cursor: str | None = None) -> Any:
        limits.append(limit)
        return real(self, prefix, limit, cursor)

    monkeypatch.setattr(type(locks["default"]), "held_locks", spy)
    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    seen: list[str] = []
    url: str | None = reverse(LIST) + "?q=dash:"
    pages = 0
    while url:
        page = boss.get(url).content.decode()
        names = re.findall(r'data-name="([^"]+)"', page)
        assert 1 <= len(names) <= 2
        seen += names
        found = re.search(r'id="distlock-next" href="([^"]+)"', page)
        url = reverse(LIST) + found.group(1).replace("&amp;", "&") if found else None
        pages += 1
        assert pages < 20
    expected = [f"dash:{a}" for a in held] + [h.name for h in extra]
    assert sorted(seen) == sorted(expected)
    assert limits and max(limits) <= 2  # the backend is asked for one page, never for all
    for handle in extra:
        handle.release()


@pytest.mark.parametrize(
    ("url", "query", "status"),
    [
        (LIST, {"cursor": "forged"}, 400),
        (LIST, {"alias": "nope"}, 404),
        (LIST, {"q": "bad\x00name"}, 400),
        (LIST, {"o": "name"}, 400),
        (DETAIL, {"alias": "default", "name": ""}, 400),
        (DETAIL, {"alias": "nope", "name": "x"}, 404),
        (RELEASE, {"alias": "default", "name": "bad\x07"}, 400),
        (RELEASE, {"alias": "sqlite-tx", "name": "x"}, 400),
    ],
)
def test_bad_arguments_are_400_or_404(
    boss: Client, url: str, query: dict[str, str], status: int
) -> None:
    assert boss.get(reverse(url), query).status_code == status


def test_a_cursor_of_another_filter_is_refused(boss: Client, held: dict[str, Lock]) -> None:
    cursor = listing.sign_position(("default", None), ("", "dash:"))
    assert boss.get(reverse(LIST), {"q": "dash:", "cursor": cursor}).status_code == 200
    assert boss.get(reverse(LIST), {"q": "other:", "cursor": cursor}).status_code == 400


def test_a_server_down_shows_a_banner_while_the_others_list(
    boss: Client, held: dict[str, Lock], settings: Any
) -> None:
    down = {
        "BACKEND": "django_distlock.backends.redis.RedisBackend",
        "LOCATION": "redis://127.0.0.1:1/0",
    }
    with override_settings(DISTLOCK={**settings.DISTLOCK, "redis-down": down}):
        page = boss.get(reverse(LIST), {"q": "dash:"}).content.decode()
    assert re.search(r'class="error distlock-alias-error" data-alias="redis-down">redis-down', page)
    assert 'data-name="dash:default"' in page


def test_a_misconfigured_alias_is_a_banner_and_a_400(boss: Client, settings: Any) -> None:
    broken = {"BACKEND": "django_distlock.backends.nope.Nope"}
    with override_settings(DISTLOCK={**settings.DISTLOCK, "broken": broken}):
        page = boss.get(reverse(LIST)).content.decode()
        assert 'data-alias="broken">broken (?) could not be listed: misconfigured' in page
        for url in (DETAIL, RELEASE):
            assert boss.get(reverse(url), {"alias": "broken", "name": "x"}).status_code == 400


def test_detail_page(boss: Client, held: dict[str, Lock]) -> None:
    handle = held["default"]
    page = boss.get(reverse(DETAIL), {"alias": "default", "name": "dash:default"})
    assert page.status_code == 200
    text = page.content.decode()
    assert f"<td>{handle.fencing_token}</td>" in text and "Force release" in text
    text = boss.get(reverse(DETAIL), {"alias": "default", "name": "free"}).content.decode()
    assert 'id="distlock-not-held"' in text


def test_the_holders_context_is_shown_escaped(boss: Client) -> None:
    """The request path or task name ``@distlock`` stored is on the list and detail pages,
    escaped like any text from a URL."""
    handle = locks["default"].lock("dash:ctx", ttl=60)
    with holder_context("GET /orders/<b>7</b>/pay"):
        handle.acquire()
    try:
        shown = "GET /orders/&lt;b&gt;7&lt;/b&gt;/pay"
        listed = boss.get(reverse(LIST), {"alias": "default", "q": "dash:ctx"}).content.decode()
        assert f'<span class="distlock-context">{shown}</span>' in listed
        detail = boss.get(reverse(DETAIL), {"alias": "default", "name": "dash:ctx"})
        assert f'<td class="distlock-context">{shown}</td>' in detail.content.decode()
        found = json.loads(call("list", "--prefix", "dash:ctx", "--json"))
        assert [i["context"] for i in found["locks"]] == ["GET /orders/<b>7</b>/pay"]
    finally:
        handle.release()


def call(*args: str) -> str:
    out = StringIO()
    call_command("distlock", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def confirm(client: Client, alias: str, name: str) -> dict[str, str]:
    """GET the confirmation page; return its form's hidden fields."""
    page = client.get(reverse(RELEASE), {"alias": alias, "name": name})
    assert page.status_code == 200
    fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.content.decode())
    return dict(fields)


RELEASING = ["default", "locmem", *PG_ALIASES[:1], *REDIS_ALIASES[:1], *ZK_ALIASES[:1]]


def require(alias: str) -> None:
    """A failure in a full run, never a skip that hides the server."""
    if alias in PG_ALIASES:
        require_pg()
    elif alias in REDIS_ALIASES:
        require_redis()
    elif alias in ZK_ALIASES:
        require_zookeeper()


@pytest.mark.parametrize("alias", RELEASING)
def test_force_release_is_confirmed_and_audited(
    boss: Client, held: dict[str, Lock], alias: str
) -> None:
    require(alias)
    form = confirm(boss, alias, f"dash:{alias}")
    assert form["owner"] == held[alias].owner_id
    response = boss.post(reverse(RELEASE), {**form, "reason": "stuck after deploy"})
    assert response.status_code == 302
    assert not locks[alias].is_locked(f"dash:{alias}")
    event = LockEvent.objects.get()
    assert (event.kind, event.alias, event.name) == ("force_released", alias, f"dash:{alias}")
    assert (event.actor, event.reason, event.owner) == ("boss", "stuck after deploy", form["owner"])
    assert event.fencing_token == held[alias].fencing_token


def test_a_release_needs_a_reason(boss: Client, held: dict[str, Lock]) -> None:
    form = confirm(boss, "default", "dash:default")
    assert boss.post(reverse(RELEASE), form).status_code == 200
    assert locks["default"].is_locked("dash:default")


def test_a_lock_taken_by_another_holder_since_is_not_released(
    boss: Client, held: dict[str, Lock]
) -> None:
    form = confirm(boss, "default", "dash:default")
    held["default"].release()
    other = locks["default"].lock("dash:default", ttl=60)
    other.acquire()
    response = boss.post(reverse(RELEASE), {**form, "reason": "x"})
    assert response.status_code == 409
    assert "held now by another holder" in response.content.decode()
    assert other.held and locks["default"].is_locked("dash:default")
    assert not LockEvent.objects.exists()
    other.release()


@pytest.mark.parametrize("alias", RELEASING)
def test_a_lock_that_changes_hands_after_the_check_is_not_released(
    boss: Client, held: dict[str, Lock], alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder changes between the view's read and its release: the server checks the
    owner shown as it frees, so the new holder keeps its lock."""
    require(alias)
    name = f"dash:{alias}"
    form = confirm(boss, alias, name)
    read, taken = views._info_or_error, []

    def read_then_hand_over(alias: str, name: str) -> Any:
        found = read(alias, name)
        held[alias].release()
        taken.append(locks[alias].lock(name, ttl=60, timeout=2))
        taken[0].acquire()
        return found

    monkeypatch.setattr(views, "_info_or_error", read_then_hand_over)
    response = boss.post(reverse(RELEASE), {**form, "reason": "stuck"})
    assert response.status_code == 302
    assert locks[alias].is_locked(name)
    taken[0].extend()  # still its holder
    event = LockEvent.objects.get()
    assert event.reason == f"{NOT_FREED} stuck" and event.owner == form["owner"]
    taken[0].release()


def test_view_only_staff_sees_no_button_and_a_forged_post_is_refused(
    boss: Client, held: dict[str, Lock]
) -> None:
    form = confirm(boss, "default", "dash:default")
    viewer = staff_with("view_held_lock")
    page = viewer.get(reverse(LIST)).content.decode()
    assert 'data-name="dash:default"' in page and "Force release" not in page
    detail = viewer.get(reverse(DETAIL), {"alias": "default", "name": "dash:default"})
    assert "Force release" not in detail.content.decode()
    assert viewer.get(reverse(RELEASE), {"alias": "default", "name": "x"}).status_code == 403
    assert viewer.post(reverse(RELEASE), {**form, "reason": "x"}).status_code == 403
    assert locks["default"].is_locked("dash:default") and not LockEvent.objects.exists()


def test_staff_without_permission_and_non_staff_get_nothing(held: dict[str, Lock]) -> None:
    assert staff_with().get(reverse(LIST)).status_code == 403
    outsider = Client()
    outsider.force_login(User.objects.create_user("joe", "j@example.com", "pw"))
    for url in (LIST, DETAIL, RELEASE):
        response = outsider.get(reverse(url), {"alias": "default", "name": "dash:default"})
        assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_release_post_needs_the_csrf_token(held: dict[str, Lock]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    form = confirm(client, "default", "dash:default")
    form.pop("csrfmiddlewaretoken", None)
    assert client.post(reverse(RELEASE), {**form, "reason": "x"}).status_code == 403
    assert locks["default"].is_locked("dash:default")


def test_the_app_index_links_the_dashboard(boss: Client) -> None:
    page = boss.get(reverse("admin:app_list", args=["distlock_admin"])).content.decode()
    assert reverse(LIST) in page
    assert "Distributed locks" in boss.get(reverse("admin:index")).content.decode()


@contextlib.contextmanager
def held_by_another_thread(alias: str, names: list[str]) -> Iterator[None]:
    """Hold ``names`` on ``alias`` from another thread (for transaction mode: its open
    transaction on that thread's connection) for the block."""
    ready, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        handles = []
        try:
            for name in names:
                handle = locks[alias].lock(name, timeout=5)
                assert handle.acquire()
                handles.append(handle)
        except BaseException as exc:
            errors.append(exc)
        ready.set()
        done.wait(60)
        for handle in reversed(handles):
            handle.release()
        connections.close_all()
        locks[alias].sessions.forget()  # type: ignore[attr-defined]  # the thread's own

    thread = threading.Thread(target=hold)
    thread.start()
    ready.wait(60)
    try:
        assert not errors, errors
        yield
    finally:
        done.set()
        thread.join(60)


def released_rows(alias: str, names: list[str]) -> None:
    """Rows of names used once and released: transaction mode keeps them."""
    backend = locks[alias]
    with psycopg.connect(**psycopg_params(backend.database), autocommit=True) as side:
        side.execute(
            "INSERT INTO django_distlock_lock (name, fencing, host, thread) "
            "SELECT unnest(%s::text[]), 1, '', ''",
            [[backend.make_key(name) for name in names]],
        )


def walk(client: Client, query: dict[str, str]) -> tuple[list[str], int]:
    """Follow the "Next page" links from the first page; return the names and page count."""
    names: list[str] = []
    url: str | None = reverse(LIST) + "?" + urlencode(query)
    pages = 0
    while url:
        page = client.get(url).content.decode()
        found = re.findall(r'data-name="([^"]+)"', page)
        assert len(found) <= views.PAGE_SIZE
        names += found
        more = re.search(r'id="distlock-next" href="([^"]+)"', page)
        url = reverse(LIST) + more.group(1).replace("&amp;", "&") if more else None
        pages += 1
        assert pages < 50
    return names, pages


def test_transaction_mode_pages_go_on_past_released_names(boss: Client) -> None:
    """Released names keep their rows in transaction mode, so its pages come back short
    with a cursor: the listing reads on in the same alias (it used to take a short page
    for the end of the alias: 10 of 100 held locks shown, no "Next page")."""
    require_pg()
    names = [f"txpage:{i:04d}" for i in range(600)]
    held = names[::6]
    released_rows("pg-tx", [n for n in names if n not in held])
    with held_by_another_thread("pg-tx", held):
        for query in ({"q": "txpage:"}, {"q": "txpage:", "alias": "pg-tx"}):
            seen, pages = walk(boss, query)
            assert seen == held
            assert pages <= 3
        found = json.loads(call("list", "--prefix", "txpage:", "--json"))
        assert [i["name"] for i in found["locks"]] == held


def test_one_held_among_thousands_of_released_names_is_listed(boss: Client) -> None:
    """3,000 old names and one held: the command prints it, the admin's pages reach it,
    each page asking the backend a bounded number of times."""
    require_pg()
    released_rows("pg-tx", [f"txold:{i:05d}" for i in range(3000)])
    reads: list[int] = []
    real = type(locks["pg-tx"]).held_locks

    def spy(self: Any, prefix: str = "", limit: int = 50, cursor: str | None = None) -> Any:
        reads.append(limit)
        return real(self, prefix, limit, cursor)

    with held_by_another_thread("pg-tx", ["txold:zz"]):
        found = json.loads(call("list", "--alias", "pg-tx", "--prefix", "txold:", "--json"))
        assert [i["name"] for i in found["locks"]] == ["txold:zz"]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(locks["pg-tx"]), "held_locks", spy)
            seen, pages = walk(boss, {"q": "txold:", "alias": "pg-tx"})
        assert seen == ["txold:zz"]
        first = boss.get(reverse(LIST), {"q": "txold:", "alias": "pg-tx"}).content.decode()
        assert 'id="distlock-read-on"' in first and "No lock held" not in first
        assert len(reads) <= pages * listing.READS_PER_PAGE


@pytest.mark.parametrize("held_count", [2, 3])
def test_a_page_full_at_the_last_held_lock_links_to_no_empty_page(
    unique: Any, held_count: int
) -> None:
    """A backend gives a cursor whenever it filled the page it was asked for, so a page
    that ends exactly at the last held lock would link to an empty one; the listing looks
    one row ahead first. 2 locks on pages of 2: one page, no next; 3: a next page with
    the third."""
    from django_distlock.contrib.admin.operations.listing import read_page

    tag = unique("exact")
    handles = [locks["locmem"].lock(f"{tag}:{i}") for i in range(held_count)]
    for handle in handles:
        assert handle.acquire()
    try:
        first = read_page(["locmem", "sqlite-tx"], tag, 2)
        assert len(first.rows) == 2
        if held_count == 2:
            assert first.next_position is None
        else:
            assert first.next_position is not None
            second = read_page(["locmem", "sqlite-tx"], tag, 2, first.next_position)
            assert [row.info.name for row in second.rows] == [f"{tag}:2"]
            assert second.next_position is None
    finally:
        for handle in handles:
            handle.release()
