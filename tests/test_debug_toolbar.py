"""The django-debug-toolbar panel (``django_distlock.contrib.debug_toolbar.LocksPanel``)
on the demo shop (``testproject``, with ``SHOP_DEBUG_TOOLBAR=1``: its settings add the
toolbar; run in subprocesses, on a SQLite file of the test's own, so that this process'
apps stay as they are): the product page's toolbar lists the locks its view took (the
stock lock of a sale, with its fencing token, and the card's rebuild lock), as the
toolbar's own panel endpoint serves it and as Chromium shows it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import debug_toolbar  # noqa: F401  (the dev extra has it: missing, the module fails)
import pytest

from .conftest import FULL_RUN
from .private_redis import _free_port

pytestmark = pytest.mark.django_versions

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

#: Sets the shop's database up and adds a product; prints its pk.
_PREPARE = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from testproject.shop.models import Product
print(Product.objects.create(name="Toolbar tea", price="3.50", stock=5).pk)
"""

#: A sale through the product page, then the page's panel as the toolbar serves it.
_SALE = """
import json, re, sys
import django
django.setup()
from django.test import Client
client = Client(HTTP_HOST="127.0.0.1")
page = client.post(f"/shop/p/{sys.argv[1]}/").content.decode()
request_id = re.search(r'data-request-id="([0-9a-f]+)"', page).group(1)
panel = client.get("/__debug__/render_panel/",
                   {"request_id": request_id, "panel_id": "LocksPanel"}).json()
print(json.dumps({"page": page, "panel": panel["content"]}))
"""


def _shop_env(folder: Path) -> dict[str, str]:
    """The demo shop with the toolbar, on a SQLite file in ``folder``, no other server
    (its cache and locks in the process and the file)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("DISTLOCK_REDIS", "DISTLOCK_ZK", "DISTLOCK_CELERY"))}
    return {**env, "DJANGO_SETTINGS_MODULE": "testproject.settings", "PYTHONPATH": str(ROOT),
            "SHOP_DEBUG_TOOLBAR": "1", "DISTLOCK_DEMO_DATABASE": "sqlite",
            "DISTLOCK_SQLITE_PATH": str(folder / "shop.sqlite3")}


def _python(code: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_the_panel_lists_the_locks_a_request_asked_for(tmp_path: Path) -> None:
    env = _shop_env(tmp_path)
    pk = _python(_PREPARE, env)
    found = json.loads(_python(_SALE, env, pk))
    page, panel = found["page"], found["panel"]
    assert 'id="bought"' in page and "djDebug" in page  # sold, and the toolbar is on
    assert "2 locks in" in page  # the panel's subtitle: the sale's lock, the card's
    rows = panel.split("<tr")[2:]  # after the header row
    assert len(rows) == 2, panel
    token = page.split("stock lock token ")[1].split(")")[0]
    assert f"stock:{pk}" in rows[0] and "acquired" in rows[0] and f">{token}<" in rows[0]
    assert "held" not in rows[0]  # released before the response: its hold time shown
    assert f"shop:product:{pk}" in rows[1] and "acquired" in rows[1]
    assert "No lock was asked for" not in panel


def test_the_panel_in_a_browser(tmp_path: Path) -> None:
    """The toolbar in headless Chromium (the shop's ``runserver``, its static files
    served by it): the product page, a click on "Buy one", then on "Locks": the table
    shows the sale's stock lock (the card was cached by the first visit). The screenshot goes to
    ``$DISTLOCK_SCREENSHOTS`` when set (``docs/img`` keeps the one the docs show)."""
    missing = None if shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER) else (
        "chromium is missing (scripts/servers.py install)")
    if missing:
        if FULL_RUN:
            pytest.fail(f"DISTLOCK_SERVERS=1 but {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    env = _shop_env(tmp_path)
    pk = _python(_PREPARE, env)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1200,800"):
        options.add_argument(argument)
    browser = None
    try:
        deadline = time.monotonic() + 30
        while True:  # until runserver answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (
                    server.communicate(timeout=5)[0] if server.poll() is not None else "")
                time.sleep(0.1)
        browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        browser.get(f"http://127.0.0.1:{port}/shop/p/{pk}/")
        wait = WebDriverWait(browser, 15)
        browser.find_element(By.ID, "buy").click()  # a sale: the page comes back
        wait.until(lambda _: browser.find_elements(By.ID, "bought"))
        # The toolbar lives in a shadow root of its own (django-debug-toolbar 6+).
        root = browser.find_element(By.ID, "djDebugRoot").shadow_root

        def found(selector: str) -> list[Any]:
            return [e for e in root.find_elements(By.CSS_SELECTOR, selector)
                    if e.is_displayed()]

        link = wait.until(lambda _: (found("#djdt-LocksPanel a") or [None])[0])
        assert "1 lock" in link.text  # the card was cached by the page before the sale
        link.click()
        cells = wait.until(lambda _: found("#LocksPanel td.djdt-distlock-name"))
        assert [cell.text for cell in cells] == [f"stock:{pk}"]
        folder = Path(os.environ.get("DISTLOCK_SCREENSHOTS") or tmp_path)
        browser.save_screenshot(str(folder / "debug-toolbar-locks.png"))
    finally:
        if browser is not None:
            browser.quit()
        server.terminate()
        server.communicate(timeout=30)
