"""Two editors, two headless Chromium browsers, the testproject's product admin.

What a person sees when someone else saved the same product first: the change
form shown again with the current values, their own changes kept and, where
both changed a field, theirs beside it; the list with a row deleted meanwhile
and a row changed meanwhile. Real Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by ``scripts/servers.py install``) driven by
selenium against pytest-django's live server, on SQLite and on PostgreSQL.

The screenshots of the conflict views go to a temporary directory, or to
``$DISTLOCK_SCREENSHOTS`` when set (``docs/img`` holds the ones the docs show:
``DISTLOCK_SCREENSHOTS=docs/img pytest tests/test_optimistic_browser.py``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import django.contrib.admin
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings

from testproject.shop.models import Product

from .browser import wait_until_left
from .conftest import FULL_RUN, require_pg

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ADMIN_STATIC = Path(django.contrib.admin.__file__).parent / "static"

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(databases=["default", "pg"], transaction=True),
]


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            return f"{path} is missing (scripts/servers.py install)"
    return None


@pytest.fixture(scope="session")
def admin_static() -> Iterator[None]:
    """The admin's CSS and JS for the live server (the suite has no staticfiles app).

    Requested before ``live_server`` so that its static handler is made with it.
    """
    with override_settings(STATIC_URL="/static/", STATIC_ROOT=str(ADMIN_STATIC)):
        yield


@pytest.fixture(scope="module")
def browsers() -> Iterator[tuple[Any, Any]]:
    """Two headless Chromium browsers: two editors, each with their own cookies."""
    missing = _missing()
    if missing:
        if FULL_RUN:
            pytest.fail(f"DISTLOCK_SERVERS=1 but {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1200,900",
    ):
        options.add_argument(argument)
    started: list[Any] = []
    try:
        for _ in range(2):
            started.append(webdriver.Chrome(service=Service(CHROMEDRIVER), options=options))
        yield started[0], started[1]
    finally:
        for browser in started:
            browser.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wanted = os.environ.get("DISTLOCK_SCREENSHOTS")
    folder = Path(wanted) if wanted else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class ToPostgres:
    """Route the shop's products to "pg"."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "pg" if model._meta.app_label == "shop" else None

    db_for_write = db_for_read

    def allow_relation(self, *objects: Any, **hints: Any) -> bool | None:
        return True


@pytest.fixture(params=["default", "pg"])
def editors(
    request: pytest.FixtureRequest, admin_static: None, live_server: Any, browsers: Any
) -> Iterator[tuple[Any, Any, str]]:
    """Alice's and Bob's browsers, logged in to the admin; the live server's URL."""
    if request.param == "pg":
        require_pg()
    routers = [ToPostgres()] if request.param == "pg" else []
    with override_settings(DATABASE_ROUTERS=routers):
        for browser, name in zip(browsers, ("alice", "bob"), strict=True):
            user = User.objects.create_superuser(name, f"{name}@example.com", "pw")
            client = Client()
            client.force_login(user)
            browser.delete_all_cookies()
            browser.get(f"{live_server.url}/admin/login/")
            cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
            browser.add_cookie({"name": settings.SESSION_COOKIE_NAME, "value": cookie})
        yield browsers[0], browsers[1], live_server.url


def _fill(browser: Any, name: str, value: str) -> None:
    from selenium.webdriver.common.by import By

    field = browser.find_element(By.NAME, name)
    field.clear()
    field.send_keys(value)


def _value(browser: Any, name: str) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.NAME, name).get_attribute("value"))


def _save(browser: Any) -> None:
    """Click "Save" and wait for the page that answers."""
    _submit(browser, "[name=_save]")


def _submit(browser: Any, selector: str) -> None:
    """Click the button ``selector`` and wait for the page that answers."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    page = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.CSS_SELECTOR, selector).click()
    wait_until_left(browser, page)
    WebDriverWait(browser, 15).until(
        lambda b: b.execute_script("return document.readyState") == "complete"
    )


def _messages(browser: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [m.text for m in browser.find_elements(By.CSS_SELECTOR, "ul.messagelist li")]


def _shot(browser: Any, folder: Path, name: str) -> None:
    from selenium.webdriver.common.by import By

    height = browser.find_element(By.TAG_NAME, "body").size["height"]
    browser.set_window_size(1200, max(600, min(height + 40, 1400)))
    assert browser.save_screenshot(str(folder / name))
    browser.set_window_size(1200, 900)


def test_two_editors_on_one_product(editors: Any, screenshots: Path) -> None:
    alice, bob, url = editors
    mug = Product.objects.create(name="Blue mug", price=Decimal("12.00"), stock=5)
    change = f"{url}/admin/shop/product/{mug.pk}/change/"
    alice.get(change)
    bob.get(change)

    _fill(bob, "price", "14.00")
    _fill(bob, "stock", "4")
    _save(bob)
    assert any("was changed successfully" in m for m in _messages(bob))

    _fill(alice, "name", "Blue mug XL")
    _fill(alice, "price", "13.50")
    _save(alice)

    page = alice.page_source
    assert "Please correct" not in page
    notes = _messages(alice)
    assert any(
        "changed by someone else since you opened it, so nothing was saved yet" in m
        and "Price (now: 14.00)" in m
        and "Stock (now: 4)" in m
        for m in notes
    ), notes
    assert _value(alice, "name") == "Blue mug XL"  # hers, which Bob did not touch
    assert _value(alice, "price") == "13.50"  # hers, where both changed it...
    assert "theirs: 14.00" in alice.find_element("css selector", ".distlock-theirs").text
    assert _value(alice, "stock") == "4"  # Bob's, which she did not touch
    _shot(alice, screenshots, "optimistic-change-form-conflict.png")
    mug.refresh_from_db()
    assert (mug.name, mug.price, mug.stock, mug.version) == ("Blue mug", Decimal("14.00"), 4, 2)

    _save(alice)  # the merged form, as shown
    assert any("was changed successfully" in m for m in _messages(alice))
    mug.refresh_from_db()
    assert (mug.name, mug.price, mug.stock, mug.version) == (
        "Blue mug XL",
        Decimal("13.50"),
        4,
        3,
    )


def test_the_list_with_rows_deleted_and_changed_meanwhile(editors: Any, screenshots: Path) -> None:
    alice, bob, url = editors
    mug = Product.objects.create(name="Blue mug", price=Decimal("12.00"), stock=5)
    cup = Product.objects.create(name="Red cup", price=Decimal("8.00"), stock=9)
    bowl = Product.objects.create(name="Green bowl", price=Decimal("20.00"), stock=3)
    listing = f"{url}/admin/shop/product/"
    alice.get(listing)
    rows = {_value(alice, f"form-{i}-id"): i for i in range(3)}
    cup_row = rows[str(cup.pk)]

    # While Alice types, Bob deletes the cup and sets the bowls' stock, in his browser.
    bob.get(f"{listing}{cup.pk}/delete/")
    _submit(bob, "input[type=submit]")
    bob.get(f"{listing}{bowl.pk}/change/")
    _fill(bob, "stock", "1")
    _save(bob)
    assert not Product.objects.filter(name="Red cup").exists()

    _fill(alice, f"form-{rows[str(mug.pk)]}-price", "11.00")
    _fill(alice, f"form-{cup_row}-stock", "10")
    _fill(alice, f"form-{rows[str(bowl.pk)]}-stock", "6")
    _save(alice)

    assert "Please correct" not in alice.page_source
    notes = _messages(alice)
    assert any("1 product was changed successfully" in m for m in notes), notes
    assert any(
        m == "“Red cup” was deleted by someone else since the list was shown; your changes "
        "to it were not saved."
        for m in notes
    ), notes
    assert any(
        "“Green bowl” was changed by someone else since the list was shown" in m
        and "(Green bowl: Stock)" in m
        for m in notes
    ), notes
    shown = {_value(alice, f"form-{i}-id"): i for i in range(2)}
    assert set(shown) == {str(mug.pk), str(bowl.pk)}
    assert _value(alice, f"form-{shown[str(bowl.pk)]}-stock") == "6"  # hers, kept
    assert "theirs: 1" in alice.find_element("css selector", ".distlock-theirs").text
    assert _value(alice, f"form-{shown[str(mug.pk)]}-price") == "11.00"  # saved
    _shot(alice, screenshots, "optimistic-changelist-conflict.png")
    bowl.refresh_from_db()
    mug.refresh_from_db()
    assert (bowl.stock, bowl.version, mug.price) == (1, 2, Decimal("11.00"))

    _save(alice)
    bowl.refresh_from_db()
    assert (bowl.stock, bowl.version) == (6, 3)
