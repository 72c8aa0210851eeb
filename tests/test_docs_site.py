"""The documentation site: built from docs/ with warnings as errors, opened in headless Chromium.

The build runs ``python -m sphinx -W --keep-going`` in a subprocess (this venv's
Python, the repository root first on ``PYTHONPATH`` so the API reference is made
from this checkout's docstrings); any warning fails it. Then a few pages are
opened as files: each has its heading, the API reference shows ``Lock.acquire``
with its docstring, and every image of a page has loaded (``naturalWidth > 0``).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from django_distlock.handle import Lock

from .conftest import FULL_RUN
from .test_optimistic_browser import browsers  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: page -> the text of its first heading (without Sphinx's pilcrow link).
PAGES = {
    "index.html": "django-distlock",
    "api.html": "API reference",
    "redis.html": "The Redis backend",
    "architecture.html": "Architecture: a lock\u2019s way from @distlock to the server and back",
    "admin-dashboard.html": "The held-locks pages of the admin",
}


def _missing() -> str | None:
    for module in ("sphinx", "myst_parser"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[dev]' or '.[docs]')"
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site's directory; the build must pass with no warning at all."""
    missing = _missing()
    if missing:
        if FULL_RUN:
            pytest.fail(f"DISTLOCK_SERVERS=1 but {missing}")
        pytest.skip(missing)
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("DJANGO_SETTINGS_MODULE", None)  # conf.py picks the testproject's settings
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html"]
    done = subprocess.run(
        [*command, str(DOCS), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"sphinx-build failed:\n{output}"
    assert "WARNING" not in output, output
    return out


def test_every_page_in_the_docs_folder_is_built(site: Path) -> None:
    """Each Markdown page of docs/ became a page of the site (none left out of the toctree)."""
    pages = {p.stem for p in DOCS.glob("*.md")}
    built = {p.stem for p in site.glob("*.html")}
    assert pages <= built, sorted(pages - built)


def test_every_image_a_page_shows_is_in_the_site(site: Path) -> None:
    """No ``<img>`` of any page points at a file the build did not copy."""
    shown = 0
    for page in site.glob("*.html"):
        for src in re.findall(r'<img [^>]*src="([^"]+)"', page.read_text()):
            assert (page.parent / src).is_file(), f"{page.name}: {src} missing"
            shown += 1
    assert shown >= 2  # the architecture diagram and the dashboard's screenshots at least


def _heading(browser: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.CSS_SELECTOR, "div.body h1").text).replace("¶", "").strip()


def _images(browser: Any) -> list[tuple[str, int]]:
    """Each ``<img>`` of the page with its natural width, once every image has finished."""
    from selenium.webdriver.support.wait import WebDriverWait

    WebDriverWait(browser, 15).until(
        lambda b: b.execute_script("return [...document.images].every(i => i.complete)")
    )
    found = browser.execute_script(
        "return [...document.images].map(i => [i.getAttribute('src'), i.naturalWidth])"
    )
    return [(str(src), int(width)) for src, width in found]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_page_renders_with_its_heading_and_images(
    site: Path, browsers: tuple[Any, Any], page: str  # noqa: F811
) -> None:
    browser = browsers[0]
    browser.get((site / page).as_uri())
    assert _heading(browser) == PAGES[page]
    for src, width in _images(browser):
        assert width > 0, f"{page}: image {src} did not load"


@pytest.mark.parametrize("page", ["index.html", "architecture.html", "admin-dashboard.html"])
def test_pages_with_figures_show_them(
    site: Path, browsers: tuple[Any, Any], page: str  # noqa: F811
) -> None:
    browser = browsers[0]
    browser.get((site / page).as_uri())
    assert _images(browser), f"{page} shows no image"


def test_the_api_reference_shows_lock_acquire_with_its_docstring(
    site: Path, browsers: tuple[Any, Any]  # noqa: F811
) -> None:
    from selenium.webdriver.common.by import By

    browser = browsers[0]
    browser.get((site / "api.html").as_uri())
    signature = browser.find_element(By.ID, "django_distlock.Lock.acquire")
    assert "acquire" in signature.text
    body = signature.find_element(By.XPATH, "following-sibling::dd[1]").text
    summary = inspect.getdoc(Lock.acquire).splitlines()[0]  # type: ignore[union-attr]
    assert summary in " ".join(body.split())
    assert "Parameters" in body and "blocking" in body  # the :param: field list, rendered
    for anchor in (
        "django_distlock.handler.LockHandler",
        "django_distlock.lock",
        "django_distlock.distlock",
        "django_distlock.MultiLock",
        "django_distlock.exceptions.LockTimeout",
        "django_distlock.signals.lock_acquired",
        "django_distlock.backends.base.BaseLockBackend",
        "django_distlock.backends.redis.RedisBackend",
        "django_distlock.backends.zookeeper.ZooKeeperBackend",
        "django_distlock.testing.history.HistoryRecorder",
    ):
        assert browser.find_elements(By.ID, anchor), f"{anchor} is not in the API reference"
