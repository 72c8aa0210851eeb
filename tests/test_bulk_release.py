"""Bulk release (every lock of a host, process, owner or prefix) on the real servers: the
operation, the admin's confirmed action and ``distlock release --host/--owner/--prefix``.

Locks are held by other OS processes (:func:`hold_elsewhere`) and by threads. Every
selection here includes a prefix unique to the test: the servers are shared, and a
host alone would select other runs' locks on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse

from django_distlock import locks
from django_distlock.contrib.admin import bulk as dashboard_bulk
from django_distlock.contrib.admin.operations.bulk import Selection, release_selected, select
from django_distlock.contrib.audit.models import LockEvent
from django_distlock.contrib.audit.recorder import BULK_NAME
from django_distlock.exceptions import LockLost
from django_distlock.handle import Lock
from django_distlock.testing.contract.support import in_thread
from django_distlock.testing.elsewhere import hold_elsewhere
from django_distlock.values import LockInfo

from .conftest import DATABASES, require_pg, require_redis, require_zookeeper
from .test_admin_dashboard_browser import login, static_root  # noqa: F401  (fixture)
from .test_optimistic_browser import _messages, _shot, _submit, browsers, screenshots  # noqa: F401

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]

BULK = "admin:django_distlock_bulk_release"
REQUIRE: dict[str, Callable[[], None]] = {
    "pg-lease": require_pg, "redis": require_redis, "zk": require_zookeeper,
}


@pytest.fixture
def prefix() -> str:
    return f"bulk-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def cleanup(prefix: str) -> Iterator[list[Lock]]:
    """Handles to release (or find freed) at the end."""
    handles: list[Lock] = []
    yield handles
    for handle in handles:
        with contextlib.suppress(LockLost):
            if handle.held:
                handle.release()
    locks.close_all()


def bulk_events() -> list[LockEvent]:
    return list(LockEvent.objects.filter(name__startswith=BULK_NAME))


def held_names(alias: str, prefix: str) -> set[str]:
    return {info.name for info in locks[alias].held_locks(prefix=prefix, limit=100)}


@pytest.mark.parametrize("alias", ["pg-lease", "redis", "zk"])
def test_one_process_freed_others_kept(alias: str, prefix: str, cleanup: list[Lock]) -> None:
    """Two other processes and a thread of this one hold locks: --host/--pid frees the
    one process' locks only, checked on the server, and one audit event lists them."""
    REQUIRE[alias]()
    with hold_elsewhere(f"{prefix}a", alias) as one, hold_elsewhere(f"{prefix}b", alias) as two:
        mine = locks[alias].lock(f"{prefix}c", ttl=60)
        in_thread(mine.acquire)
        cleanup.append(mine)
        listed = {info.name: info for info in locks[alias].held_locks(prefix=prefix)}
        host = listed[f"{prefix}a"].host
        assert listed[f"{prefix}a"].pid == one.pid and listed[f"{prefix}c"].host == host
        one.kill()  # the process died holding its lock (a lease, a session: still held)
        selection = Selection(host=host, pid=one.pid, prefix=prefix)
        preview = select(selection, [alias])
        assert [i.name for i in preview.locks] == [f"{prefix}a"] and not preview.more
        outcome = release_selected(preview.locks, selection, "tester", "host died")
        assert [i.name for i in outcome.freed] == [f"{prefix}a"] and not outcome.skipped
        assert held_names(alias, prefix) == {f"{prefix}b", f"{prefix}c"}
        assert two.alive and two.owner_id == listed[f"{prefix}b"].owner
    (event,) = bulk_events()
    assert event.kind == LockEvent.FORCE_RELEASED and event.alias == alias
    assert event.actor == "tester" and event.host == host and event.pid == one.pid
    assert event.reason.startswith("host died\nFreed 1, skipped 0.")
    assert f"freed: {alias} {prefix}a (owner {one.owner_id}" in event.reason
    assert f"{prefix}b" not in event.reason and f"{prefix}c" not in event.reason


def test_a_zookeeper_selection_reads_the_lock_parents_once(
    prefix: str, cleanup: list[Lock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A selection walks its pages with one read of every lock parent's name, not one
    per page (5 locks, pages of 2: 3 pages, 3 reads before)."""
    require_zookeeper()
    from django_distlock.contrib.admin.operations import bulk

    from .test_admin_dashboard_totals import root_reads

    for i in range(5):
        cleanup.append(locks["zk"].lock(f"{prefix}{i}"))
        assert cleanup[-1].acquire(timeout=5)
    monkeypatch.setattr(bulk, "MAX_PAGE", 2)
    sent = root_reads(locks["zk"], monkeypatch)
    preview = select(Selection(prefix=prefix), ["zk"])
    assert [i.name for i in preview.locks] == [f"{prefix}{i}" for i in range(5)]
    assert len(sent) == 1


def test_owner_and_prefix_with_threads(prefix: str, cleanup: list[Lock]) -> None:
    require_redis()
    backend = locks["redis"]
    first, second = backend.lock(f"{prefix}x:1", ttl=60), backend.lock(f"{prefix}x:2", ttl=60)
    other = backend.lock(f"{prefix}y:1", ttl=60)
    for handle in (first, second, other):
        in_thread(handle.acquire)
        cleanup.append(handle)
    by_owner = Selection(owner=first.owner_id or "", prefix=prefix)
    assert [i.name for i in select(by_owner, ["redis"]).locks] == [f"{prefix}x:1"]
    under = Selection(prefix=f"{prefix}x:")
    found = select(under, ["redis"])
    assert {i.name for i in found.locks} == {f"{prefix}x:1", f"{prefix}x:2"}
    outcome = release_selected(found.locks, under, "tester", "deploy")
    assert len(outcome.freed) == 2
    assert held_names("redis", prefix) == {f"{prefix}y:1"}
    with pytest.raises(LockLost):
        first.release()  # the holder finds out at its next release


def test_retaken_lock_is_skipped_and_the_maximum_is_reported(
    prefix: str, cleanup: list[Lock]
) -> None:
    require_redis()
    backend = locks["redis"]
    handles = [backend.lock(f"{prefix}{n}", ttl=60) for n in range(3)]
    for handle in handles:
        handle.acquire()
    cleanup.extend(handles)
    selection = Selection(prefix=prefix)
    capped = select(selection, ["redis"], maximum=2)
    assert len(capped.locks) == 2 and capped.more
    assert select(selection, ["redis"], max_read=1).more
    preview = select(selection, ["redis"])
    handles[0].release()
    again = backend.lock(f"{prefix}0", ttl=60)
    again.acquire()  # another holder took it since the preview
    cleanup.append(again)
    outcome = release_selected(preview.locks, selection, "tester", "why")
    assert {i.name for i in outcome.freed} == {f"{prefix}1", f"{prefix}2"}
    assert [(i.name, why) for i, why in outcome.skipped] == [
        (f"{prefix}0", "no longer held by that holder")
    ]
    assert again.held and backend.is_locked(f"{prefix}0")
    (event,) = bulk_events()
    assert f"skipped: redis {prefix}0" in event.reason and "Freed 2, skipped 1." in event.reason


def test_failures_and_unchecked_locks_are_skipped_and_recorded(
    settings: Any, prefix: str, cleanup: list[Lock]
) -> None:
    """A server down at release time, and a lock listed with no owner id (never freed
    blindly): skipped with why, in the one audit event; the others still freed."""
    handle = locks["locmem"].lock(f"{prefix}a", ttl=60)
    handle.acquire()
    cleanup.append(handle)
    listed = locks["locmem"].held_locks(prefix=prefix).locks[0]
    down = {"BACKEND": "django_distlock.backends.redis.RedisBackend",
            "LOCATION": "redis://127.0.0.1:1/0"}
    targets = [
        LockInfo("down", f"{prefix}x", "0123abcd", 1, None, None, "h", 1, ""),
        LockInfo("locmem", f"{prefix}a", "", 1, None, None, "h", 1, ""),
        listed,
    ]
    with override_settings(DISTLOCK={**settings.DISTLOCK, "down": down}):
        outcome = release_selected(targets, Selection(prefix=prefix), "tester", "why")
    assert outcome.freed == [listed]
    why = {info.alias + ("-" if not info.owner else ""): w for info, w in outcome.skipped}
    assert why["down"].startswith("failed: ") and why["locmem-"].startswith("no owner id")
    (event,) = bulk_events()
    assert event.alias == "*" and "Freed 1, skipped 2." in event.reason


#: For tests that fail before any query: a rollback, not a flush of every database.
NO_FLUSH = pytest.mark.django_db(databases=["default"])


@NO_FLUSH
def test_selection_must_select_something() -> None:
    for bad in ({}, {"pid": 4}, {"owner": "zz"}, {"prefix": "a\x00"}):
        with pytest.raises(ValueError):
            Selection(**bad)


# The admin's action.


@pytest.fixture
def boss() -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    return client


def confirm_form(client: Client, query: dict[str, str]) -> tuple[str, dict[str, str]]:
    """GET the preview; return its page and the confirmation form's fields."""
    response = client.get(reverse(BULK), query)
    assert response.status_code == 200
    page = response.content.decode()
    context = response.context
    data = {
        "shown": context["confirm"].initial["shown"],
        "reason": "host web-3 died",
        "csrfmiddlewaretoken": response.cookies["csrftoken"].value
        if "csrftoken" in response.cookies else client.cookies["csrftoken"].value,
    }
    return page, data


def test_admin_preview_then_confirm_frees_only_what_was_shown(
    boss: Client, prefix: str, cleanup: list[Lock]
) -> None:
    require_pg()
    with hold_elsewhere(f"{prefix}a", "pg-lease") as gone:
        kept = locks["pg-lease"].lock(f"{prefix}b", ttl=60)
        kept.acquire()
        cleanup.append(kept)
        host = locks["pg-lease"].held_locks(prefix=prefix).locks[0].host
        page, data = confirm_form(
            boss, {"alias": "pg-lease", "host": host, "pid": str(gone.pid), "q": prefix}
        )
        assert f'data-name="{prefix}a"' in page and f'data-name="{prefix}b"' not in page
        assert "Yes, force-release 1 lock" in page
        # Meanwhile a lock taken under the prefix after the preview is not in it.
        late = locks["pg-lease"].lock(f"{prefix}c", ttl=60)
        late.acquire()
        cleanup.append(late)
        gone.kill()
        response = boss.post(reverse(BULK), data, follow=True)
        assert response.status_code == 200
        shown = [str(m) for m in response.context["messages"]]
        assert any("Released 1 lock (" in m for m in shown), shown
        assert held_names("pg-lease", prefix) == {f"{prefix}b", f"{prefix}c"}
    (event,) = bulk_events()
    assert event.actor == "boss" and event.reason.startswith("host web-3 died")


def test_admin_confirm_skips_a_lock_retaken_since_the_preview(
    boss: Client, prefix: str, cleanup: list[Lock]
) -> None:
    require_zookeeper()
    first = locks["zk"].lock(f"{prefix}a", ttl=60)
    first.acquire()
    _, data = confirm_form(boss, {"alias": "zk", "q": prefix})
    first.release()
    second = locks["zk"].lock(f"{prefix}a", ttl=60)
    second.acquire()
    cleanup.append(second)
    response = boss.post(reverse(BULK), data, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert any("Released 0 locks" in m for m in shown)
    assert any("1 not released" in m for m in shown), shown
    assert second.held and locks["zk"].is_locked(f"{prefix}a")
    (event,) = bulk_events()
    assert "Freed 0, skipped 1." in event.reason and "no longer held" in event.reason


def test_admin_permissions_csrf_and_forgery(
    boss: Client, prefix: str, cleanup: list[Lock]
) -> None:
    handle = locks["locmem"].lock(f"{prefix}a", ttl=60)
    handle.acquire()
    cleanup.append(handle)
    viewer = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_held_lock"))
    staff = Client()
    staff.force_login(viewer)
    list_page = staff.get(reverse("admin:django_distlock_held_locks")).content.decode()
    assert "distlock-bulk-release" not in list_page
    assert "distlock-bulk-release" in boss.get(
        reverse("admin:django_distlock_held_locks")).content.decode()
    assert staff.get(reverse(BULK), {"q": prefix}).status_code == 403
    _, data = confirm_form(boss, {"alias": "locmem", "q": prefix})
    assert staff.post(reverse(BULK), data).status_code == 403
    no_csrf = {k: v for k, v in data.items() if k != "csrfmiddlewaretoken"}
    assert boss.post(reverse(BULK), no_csrf).status_code == 403
    forged = {**data, "shown": data["shown"][:-3] + "abc"}
    assert boss.post(reverse(BULK), forged).status_code == 400
    other = User.objects.create_superuser("other", "o@example.com", "pw")
    thief = Client()
    thief.force_login(other)
    response = thief.post(reverse(BULK), data)  # another user's confirmation
    assert response.status_code == 400 and b"another user" in response.content
    assert handle.held and locks["locmem"].is_locked(f"{prefix}a") and not bulk_events()
    page = boss.get(reverse(BULK), {"host": "", "q": ""}).content.decode()
    assert "none was given" in page
    assert "Yes, force-release" not in page


def test_admin_preview_says_more_remain(
    boss: Client, prefix: str, cleanup: list[Lock], monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(2):
        handle = locks["locmem"].lock(f"{prefix}{n}", ttl=60)
        handle.acquire()
        cleanup.append(handle)
    monkeypatch.setattr(dashboard_bulk, "ADMIN_MAXIMUM", 1)
    page = boss.get(reverse(BULK), {"alias": "locmem", "q": prefix}).content.decode()
    assert "1 lock held (more remain" in page and "Yes, force-release 1 lock" in page


# The command.


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("distlock", "release", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_command_dry_run_json_and_yes(prefix: str, cleanup: list[Lock]) -> None:
    require_redis()
    with hold_elsewhere(f"{prefix}a", "redis") as child:
        mine = locks["redis"].lock(f"{prefix}b", ttl=60)
        mine.acquire()
        cleanup.append(mine)
        host = locks["redis"].held_locks(prefix=prefix).locks[0].host
        args = ("--host", host, "--pid", str(child.pid), "--prefix", prefix, "--alias", "redis")
        out, _ = run(*args, "--dry-run")
        assert f"{prefix}a" in out and f"{prefix}b" not in out and "--dry-run" in out
        dry = json.loads(run(*args, "--dry-run", "--json")[0])
        assert [i["name"] for i in dry["locks"]] == [f"{prefix}a"] and dry["dry_run"]
        assert dry["locks"][0]["owner"] == child.owner_id
        assert held_names("redis", prefix) == {f"{prefix}a", f"{prefix}b"} and not bulk_events()
        child.kill()
        done = json.loads(run(*args, "--reason", "dead worker", "--yes", "--json")[0])
        assert [i["name"] for i in done["freed"]] == [f"{prefix}a"] and done["skipped"] == []
        assert held_names("redis", prefix) == {f"{prefix}b"}
    out, _ = run("--owner", mine.owner_id or "", "--prefix", prefix, "--reason", "r", "--yes")
    assert f"Released 1 lock(s) (owner={mine.owner_id} prefix={prefix})" in out
    assert not held_names("redis", prefix)
    none = json.loads(run("--prefix", prefix, "--reason", "r", "--yes", "--json")[0])
    assert none["freed"] == [] and none["skipped"] == [] and not none["more"]
    events = bulk_events()
    assert len(events) == 2 and all(e.actor.startswith("command:") for e in events)


def test_command_refuses_without_yes_off_a_terminal(
    prefix: str, cleanup: list[Lock], monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = locks["locmem"].lock(f"{prefix}a", ttl=60)
    handle.acquire()
    cleanup.append(handle)
    with open(os.devnull) as devnull:
        monkeypatch.setattr("sys.stdin", devnull)
        with pytest.raises(CommandError, match="--yes"):
            run("--prefix", prefix, "--reason", "stuck")
    prompts: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt: prompts.append(prompt) or "n")
    with pytest.raises(CommandError, match="Not released"):
        run("--prefix", prefix, "--reason", "stuck")
    assert f"Force-release these 1 lock(s) (prefix={prefix})" in prompts[0]
    assert handle.held and locks["locmem"].is_locked(f"{prefix}a") and not bulk_events()


@pytest.mark.parametrize(
    "args, message",
    [
        (("--pid", "3", "--reason", "r"), "with its host"),
        (("locmem", "x", "--prefix", "p", "--reason", "r"), "either ALIAS NAME"),
        (("--reason", "r"), "Name one lock"),
        (("locmem", "x", "--reason", "r", "--dry-run"), "go with a bulk release"),
        (("--prefix", "p"), "--reason"),
        (("--prefix", "p", "--reason", "r", "--json"), "only with --yes"),
        (("--prefix", "p", "--alias", "nope", "--dry-run"), "No lock alias"),
        (("--owner", "nothex!!", "--dry-run"), "owner"),
    ],
)
@NO_FLUSH
def test_command_bad_arguments(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_single_release_still_works(monkeypatch: Any, prefix: str) -> None:
    handle = locks["locmem"].lock(f"{prefix}one", ttl=60)
    handle.acquire()
    out, _ = run("locmem", f"{prefix}one", "--reason", "stuck", "--yes")
    assert f"Released {prefix}one on locmem." in out
    assert LockEvent.objects.get().name == f"{prefix}one"


# The confirm page in headless Chromium (the browser is shared with the other browser tests).


def test_bulk_release_in_a_browser(
    static_root: None,  # noqa: F811
    live_server: Any,
    browsers: tuple[Any, Any],  # noqa: F811
    screenshots: Path,  # noqa: F811
    prefix: str,
    cleanup: list[Lock],
) -> None:
    from selenium.webdriver.common.by import By

    handles = [locks["locmem"].lock(f"{prefix}job:{n}", ttl=60) for n in range(3)]
    for handle in handles:
        handle.acquire()
    cleanup.extend(handles)
    browser = browsers[0]
    base = live_server.url
    login(browser, base, User.objects.create_superuser("boss", "b@example.com", "pw"))
    browser.get(f"{base}/admin/distlock_admin/heldlock/held/?alias=locmem&q={prefix}")
    _submit(browser, "#distlock-bulk-release")
    shown = browser.find_elements(By.CSS_SELECTOR, "tr.distlock-bulk-row")
    assert [r.get_attribute("data-name") for r in shown] == [f"{prefix}job:{n}" for n in range(3)]
    assert browser.find_element(By.ID, "distlock-bulk-count").text.startswith("3 locks held")
    browser.find_element(By.NAME, "reason").send_keys("worker pool replaced")
    _shot(browser, screenshots, "admin-bulk-release.png")
    _submit(browser, "#distlock-confirm")
    assert any(m.startswith("Released 3 locks (prefix=") for m in _messages(browser))
    assert not held_names("locmem", prefix)
    (event,) = bulk_events()
    assert event.actor == "boss" and event.reason.count("\nfreed: locmem ") == 3
