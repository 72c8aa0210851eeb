"""What the headless-Chromium tests share."""

from __future__ import annotations

from typing import Any

#: chromedriver's words when a node of a replaced document is touched, as a plain
#: WebDriverException instead of StaleElementReferenceException (timing-dependent).
_GONE = "does not belong to the document"


def wait_until_left(browser: Any, page: Any, timeout: float = 15) -> None:
    """Wait until ``page`` (the ``<html>`` element of the page before a click) is gone:
    the browser shows the page that answered."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.wait import WebDriverWait

    def left(_: Any) -> bool:
        try:
            page.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if _GONE in str(exc):
                return True
            raise
        return False

    WebDriverWait(browser, timeout).until(left)
