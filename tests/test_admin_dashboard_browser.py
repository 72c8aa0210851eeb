"""The held-locks pages in headless Chromium, with real locks held on every listing alias.

A superuser lists, filters, searches, opens a lock, force-releases it and
finds the audit entry; a staff user with the view permission only sees no
release button and has a forged POST refused; a server that is down shows its
banner. Reuses the browser setup of ``test_optimistic_browser``. Screenshots
go to ``$DISTLOCK_SCREENSHOTS`` when set (``docs/img`` holds the docs' ones).
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

import django_distlock
from django_distlock import locks
from django_distlock.contrib.admin import views
from django_distlock.contrib.audit.models import LockEvent
from django_distlock.contrib.audit.recorder import recorder
from django_distlock.handle import Lock

from .browser import wait_until_left
from .conftest import DATABASES, FULL_RUN, require_zookeeper
from .test_admin_dashboard import held  # noqa: F401  (fixture)
from .test_optimistic_browser import (  # noqa: F401  (fixtures)
    ADMIN_STATIC,
    _messages,
    _shot,
    _submit,
    browsers,
    screenshots,
)

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]

PACKAGE_STATIC = Path(django_distlock.__file__).parent / "contrib" / "admin" / "static"


@pytest.fixture(scope="module")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The admin's static files and the package's, for the live server (no staticfiles app)."""
    root = tmp_path_factory.mktemp("static")
    for source in (ADMIN_STATIC / "admin", PACKAGE_STATIC / "distlock_admin"):
        shutil.copytree(source, root / source.name)
    with override_settings(STATIC_URL="/static/", STATIC_ROOT=str(root)):
        yield


def login(browser: Any, base: str, user: User, refresh: bool = False) -> None:
    """Log ``user`` in; auto-refresh off in this browser unless ``refresh`` (a reload in
    the middle of a step would replace the page under the test)."""
    client = Client()
    client.force_login(user)
    browser.delete_all_cookies()
    browser.get(f"{base}/admin/login/")
    browser.add_cookie(
        {
            "name": settings.SESSION_COOKIE_NAME,
            "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
        }
    )
    if refresh:
        browser.execute_script("localStorage.removeItem('django_distlock.refresh')")
    else:
        browser.execute_script("localStorage.setItem('django_distlock.refresh', '0')")


def rows(browser: Any) -> list[tuple[str, str]]:
    from selenium.webdriver.common.by import By

    found = browser.find_elements(By.CSS_SELECTOR, "tr.distlock-row")
    return [(r.get_attribute("data-alias"), r.get_attribute("data-name")) for r in found]


def click(browser: Any, text: str, by: str = "link text") -> None:
    from selenium.webdriver.common.by import By

    page = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(by, text).click()
    wait_until_left(browser, page)


def test_operator_and_viewer_in_a_browser(
    static_root: None,
    live_server: Any,
    browsers: tuple[Any, Any],  # noqa: F811
    screenshots: Path,  # noqa: F811
    held: dict[str, Lock],  # noqa: F811
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.wait import WebDriverWait

    boss, viewer = browsers
    base = live_server.url
    login(boss, base, User.objects.create_superuser("boss", "b@example.com", "pw"))
    boss.get(f"{base}/admin/")
    # The app's caption (shown upper-case) on the admin index.
    click(boss, "caption a[href$='/admin/distlock_admin/']", By.CSS_SELECTOR)
    click(boss, "Held locks")
    listed = rows(boss)
    assert {alias for alias, _ in listed} >= set(held)
    assert "sqlite-tx (SQLite (transaction)) cannot list its locks." in boss.page_source

    # The countdown runs in the page: its text moves to "N s" and keeps counting down.
    countdown = boss.find_element(By.CSS_SELECTOR, ".distlock-countdown")
    WebDriverWait(boss, 5).until(lambda b: re.search(r"\d+ s$", countdown.text))
    first = countdown.text
    WebDriverWait(boss, 5).until(lambda b: countdown.text != first)
    # The table (the totals above it have their own screenshot).
    boss.execute_script("document.getElementById('distlock-order-note').scrollIntoView()")
    _shot(boss, screenshots, "admin-held-locks.png")

    Select(boss.find_element(By.NAME, "alias")).select_by_value("locmem")
    _submit(boss, "#changelist-search input[type=submit]")
    assert rows(boss) == [("locmem", "dash:locmem")]
    Select(boss.find_element(By.NAME, "alias")).select_by_value("")
    search = boss.find_element(By.NAME, "q")
    search.clear()
    search.send_keys("dash:sqlite")
    _submit(boss, "#changelist-search input[type=submit]")
    assert rows(boss) == [("sqlite-lease", "dash:sqlite-lease")]

    click(boss, "dash:sqlite-lease")
    assert str(held["sqlite-lease"].fencing_token) in boss.find_element(By.ID, "held-lock").text
    click(boss, "Force release…")
    boss.find_element(By.NAME, "reason").send_keys("worker hung after deploy")
    _shot(boss, screenshots, "admin-force-release.png")
    _submit(boss, "#distlock-confirm")
    assert "Released dash:sqlite-lease on sqlite-lease." in _messages(boss)
    assert ("sqlite-lease", "dash:sqlite-lease") not in rows(boss)
    assert not locks["sqlite-lease"].is_locked("dash:sqlite-lease")
    boss.get(f"{base}/admin/distlock_audit/lockevent/")
    audit = boss.find_element(By.ID, "result_list").text
    assert "force-released" in audit and "dash:sqlite-lease" in audit and "boss" in audit
    event = LockEvent.objects.get()
    assert event.reason == "worker hung after deploy"

    # A staff user with the view permission only: no button, and a forged POST is refused.
    user = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_held_lock"))
    login(viewer, base, user)
    viewer.get(f"{base}/admin/distlock_admin/heldlock/held/")
    assert ("default", "dash:default") in rows(viewer)
    assert not viewer.find_elements(By.CSS_SELECTOR, ".distlock-release")
    status = viewer.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const token = document.querySelector("[name=csrfmiddlewaretoken]").value;
        const body = new URLSearchParams({csrfmiddlewaretoken: token, alias: "default",
            name: "dash:default", owner: arguments[0], fencing_token: arguments[1],
            reason: "forged"});
        fetch("/admin/distlock_admin/heldlock/held/release/", {method: "POST", body})
            .then(r => done(r.status));
        """,
        held["default"].owner_id,
        str(held["default"].fencing_token),
    )
    assert status == 403
    assert locks["default"].is_locked("dash:default") and LockEvent.objects.count() == 1

    # A ZooKeeper lock (a session lock: no expiry): filtered, opened, force-released.
    if "zk" in settings.DISTLOCK or FULL_RUN:
        require_zookeeper()
        boss.get(f"{base}/admin/distlock_admin/heldlock/held/")
        Select(boss.find_element(By.NAME, "alias")).select_by_value("zk")
        _submit(boss, "#changelist-search input[type=submit]")
        assert rows(boss) == [("zk", "dash:zk")]
        click(boss, "dash:zk")
        detail = boss.find_element(By.ID, "held-lock").text
        assert "zk (ZooKeeper)" in detail and str(held["zk"].fencing_token) in detail
        click(boss, "Force release…")
        boss.find_element(By.NAME, "reason").send_keys("session of a frozen worker")
        _submit(boss, "#distlock-confirm")
        assert "Released dash:zk on zk." in _messages(boss)
        assert not locks["zk"].is_locked("dash:zk")
        assert LockEvent.objects.filter(alias="zk", actor="boss").count() == 1

    # A server that is down: its banner, and the other aliases still listed.
    down = {
        "BACKEND": "django_distlock.backends.redis.RedisBackend",
        "LOCATION": "redis://127.0.0.1:1/0",
    }
    with override_settings(DISTLOCK={**settings.DISTLOCK, "redis-down": down}):
        boss.get(f"{base}/admin/distlock_admin/heldlock/held/")
        banner = boss.find_element(By.CSS_SELECTOR, ".distlock-alias-error[data-alias=redis-down]")
        assert banner.text.startswith("redis-down (Redis) could not be listed:")
        assert ("locmem", "dash:locmem") in rows(boss)
        _shot(boss, screenshots, "admin-held-locks-server-down.png")

    # Real lock traffic on an audited alias, then its activity charts.
    audited = {**settings.DISTLOCK["locmem"], "AUDIT": True, "KEY_PREFIX": "audited:"}
    with override_settings(DISTLOCK={**settings.DISTLOCK, "audited": audited}):
        contend("audited")
        recorder.flush()
        boss.get(f"{base}/admin/")
        click(boss, "caption a[href$='/admin/distlock_admin/']", By.CSS_SELECTOR)
        click(boss, "Lock activity")
        Select(boss.find_element(By.NAME, "window")).select_by_value("1h")
        _submit(boss, "#changelist-search input[type=submit]")
        charts = boss.find_elements(By.CSS_SELECTOR, "svg.distlock-chart")
        assert len(charts) == 6
        row = boss.find_element(By.CSS_SELECTOR, "tr[data-alias=audited][data-prefix='report:']")
        cells = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
        assert int(cells[2]) >= 41 and int(cells[3]) > 0  # 40 + report:busy; busy misses
        _shot(boss, screenshots, "admin-activity.png")


def contend(alias: str) -> None:
    """Four threads take "report:<n>" locks ten times each; short waits time out."""

    def worker(index: int) -> None:
        for round_ in range(10):
            handle = locks[alias].lock(f"report:{round_ % 3}", ttl=5, timeout=0.3)
            while not handle.acquire():
                pass
            time.sleep(0.002 * (1 + index))
            handle.release()
        busy = locks[alias].lock("report:busy", ttl=5, blocking=False)
        if busy.acquire():
            time.sleep(0.05)
            busy.release()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_clocks_and_auto_refresh_in_a_browser(
    static_root: None,
    live_server: Any,
    browsers: tuple[Any, Any],  # noqa: F811
    screenshots: Path,  # noqa: F811
    held: dict[str, Lock],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """"Held for" runs in the page; the page reloads itself every REFRESH seconds until
    the operator unticks the box (kept in the URL and in the browser), and not while
    they type in a field. The admin home links "Held locks"."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    monkeypatch.setattr(views, "REFRESH", 2)  # the live server runs in this process
    boss, _ = browsers
    base = live_server.url
    login(boss, base, User.objects.create_superuser("boss", "b@example.com", "pw"), refresh=True)
    boss.get(f"{base}/admin/")
    _shot(boss, screenshots, "admin-home.png")
    click(boss, "Held locks")  # the admin home's own entry
    assert boss.current_url.endswith("/admin/distlock_admin/heldlock/held/")
    # On by default: the page reloads itself (a mark set in it is gone).
    on = "return document.getElementById('distlock-refresh').checked"
    assert boss.execute_script(on)
    boss.execute_script("window.distlockMark = 1")
    WebDriverWait(boss, 6).until(lambda b: b.execute_script("return !window.distlockMark"))
    WebDriverWait(boss, 5).until(
        lambda b: b.execute_script("return document.readyState") == "complete"
    )
    boss.find_element(By.ID, "distlock-refresh").click()  # off, within the 2 s
    assert "refresh=0" in boss.current_url
    links = boss.find_elements(By.CSS_SELECTOR, ".distlock-total a")  # keep the choice
    assert links and all("refresh=0" in a.get_attribute("href") for a in links)
    counts = {
        row.get_attribute("data-alias"): row.find_element(By.CLASS_NAME, "distlock-total-count")
        for row in boss.find_elements(By.CSS_SELECTOR, ".distlock-total")
    }
    assert counts["locmem"].text == "1" and counts["pg-tx"].text == "unknown"
    held_for = boss.find_element(By.CSS_SELECTOR, "tr[data-alias=locmem] .distlock-held-for")
    WebDriverWait(boss, 5).until(lambda b: re.fullmatch(r"\d+ s", held_for.text))
    first = held_for.text
    WebDriverWait(boss, 5).until(lambda b: held_for.text != first)
    boss.execute_script("window.distlockMark = 1")
    time.sleep(3)
    assert boss.execute_script("return window.distlockMark") == 1
    assert boss.find_element(By.ID, "distlock-refresh-state").text == "off"
    boss.execute_script("window.scrollTo(0, 0)")
    _shot(boss, screenshots, "admin-held-locks-totals.png")
    boss.get(f"{base}/admin/distlock_admin/heldlock/held/")  # no ?refresh: the browser's
    assert not boss.find_element(By.ID, "distlock-refresh").is_selected()

    # On again; typing a search pauses it.
    boss.get(f"{base}/admin/distlock_admin/heldlock/held/?refresh=2")
    assert boss.find_element(By.ID, "distlock-refresh").is_selected()
    boss.find_element(By.NAME, "q").send_keys("dash:")
    boss.execute_script("window.distlockMark = 1")
    time.sleep(3)
    assert boss.execute_script("return window.distlockMark") == 1
    assert boss.find_element(By.ID, "distlock-refresh-state").text == "paused"
    boss.execute_script("localStorage.setItem('django_distlock.refresh', '0')")


def test_the_merged_view_by_age_in_a_browser(
    static_root: None,
    live_server: Any,
    browsers: tuple[Any, Any],  # noqa: F811
    screenshots: Path,  # noqa: F811
    held: dict[str, Lock],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """"Held longest first" merges the lease aliases by age (two a page here), pages
    forth and back, and says which aliases it leaves out and why."""
    from selenium.webdriver.common.by import By

    monkeypatch.setattr(views, "PAGE_SIZE", 2)  # the live server runs in this process
    merged = [alias for alias in held if getattr(locks[alias], "supports_age_order", False)]
    assert len(merged) >= 3, merged  # default, sqlite-lease, pg-lease
    expected = [(alias, f"dash:{alias}") for alias in merged]  # the fixture's order
    boss, _ = browsers
    base = live_server.url
    login(boss, base, User.objects.create_superuser("boss", "b@example.com", "pw"))
    boss.get(f"{base}/admin/distlock_admin/heldlock/held/?q=dash:")
    click(boss, "held longest first")
    assert "by=acquired" in boss.current_url
    assert rows(boss) == expected[:2]
    banners = {  # one a reason
        banner.text: banner.get_attribute("data-aliases").split()
        for banner in boss.find_elements(By.CSS_SELECTOR, ".distlock-left-out")
    }
    left_out = [alias for aliases in banners.values() for alias in aliases]
    assert sorted(left_out) == sorted(set(held) - set(merged))  # locmem, Redis, ZooKeeper...
    redis = next(text for text, aliases in banners.items() if "redis" in aliases)
    assert redis.startswith("Not in this order: ") and "in name order" in redis
    # The order links, the left-out aliases' reasons and the table (a taller window
    # first: the totals above take most of one).
    boss.set_window_size(1200, 1000)
    boss.execute_script("document.getElementById('distlock-orders').scrollIntoView()")
    assert boss.save_screenshot(str(screenshots / "admin-held-locks-merged.png"))
    boss.set_window_size(1200, 900)
    pages = [rows(boss)]
    while boss.find_elements(By.ID, "distlock-next"):
        click(boss, "distlock-next", By.ID)
        pages.append(rows(boss))
    assert [row for page in pages for row in page] == expected and len(pages) >= 2
    click(boss, "distlock-prev", By.ID)
    assert rows(boss) == pages[-2]
    click(boss, "expiring soonest first")
    assert "by=expires" in boss.current_url and rows(boss) == expected[:2]  # one TTL: in turn
