"""The django-debug-toolbar panel (``django_distlock.contrib.debug_toolbar.LocksPanel``)
in a site of its own (``tests/debug_toolbar_settings.py``, run in a subprocess so that this
process' apps stay as they are): a page's toolbar lists the locks its view asked for,
with their outcome, wait, hold and token, as the toolbar's own panel endpoint serves it."""

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

import pytest

from .conftest import FULL_RUN
from .private_redis import _free_port

pytest.importorskip("debug_toolbar")

pytestmark = pytest.mark.django_versions

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

_SCRIPT = """
import json, re
import django
django.setup()
from django.test import Client
client = Client()
page = client.get("/order/7/").content.decode()
request_id = re.search(r'data-request-id="([0-9a-f]+)"', page).group(1)
panel = client.get("/__debug__/render_panel/",
                   {"request_id": request_id, "panel_id": "LocksPanel"}).json()
print(json.dumps({"page": page, "panel": panel["content"]}))
"""


def test_the_panel_lists_the_locks_a_request_asked_for(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.debug_toolbar_settings",
             "PYTHONPATH": str(ROOT), "DISTLOCK_SQLITE_DIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    page, panel = found["page"], found["panel"]
    assert "again: False" in page and "djDebug" in page  # the toolbar is on the page
    assert "3 locks in" in page  # the panel's subtitle: two grants and a busy try
    rows = panel.split("<tr")[2:]  # after the header row
    assert len(rows) == 3, panel
    assert "order:7" in rows[0] and "acquired" in rows[0] and "held" not in rows[0]
    assert "stock:7" in rows[1] and "acquired" in rows[1]
    assert "order:7" in rows[2] and "busy" in rows[2] and "&mdash;" in rows[2]
    assert "No lock was asked for" not in panel


def test_the_panel_in_a_browser(tmp_path: Path) -> None:
    """The toolbar in headless Chromium (``runserver`` of the site, its static files
    served by it): a click on "Locks" shows the table. The screenshot goes to
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

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.debug_toolbar_settings",
             "PYTHONPATH": str(ROOT), "DISTLOCK_SQLITE_DIR": str(tmp_path)},
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
        browser.get(f"http://127.0.0.1:{port}/order/7/")
        wait = WebDriverWait(browser, 15)
        # The toolbar lives in a shadow root of its own (django-debug-toolbar 6+).
        root = browser.find_element(By.ID, "djDebugRoot").shadow_root

        def found(selector: str) -> list[Any]:
            return [e for e in root.find_elements(By.CSS_SELECTOR, selector)
                    if e.is_displayed()]

        link = wait.until(lambda _: (found("#djdt-LocksPanel a") or [None])[0])
        assert "3 locks" in link.text
        link.click()
        cells = wait.until(lambda _: found("#LocksPanel td.djdt-distlock-name"))
        assert [cell.text for cell in cells] == ["order:7", "stock:7", "order:7"]
        folder = Path(os.environ.get("DISTLOCK_SCREENSHOTS") or tmp_path)
        browser.save_screenshot(str(folder / "debug-toolbar-locks.png"))
    finally:
        if browser is not None:
            browser.quit()
        server.terminate()
        server.communicate(timeout=30)
