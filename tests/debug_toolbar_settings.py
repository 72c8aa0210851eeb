"""Settings of a site with django-debug-toolbar and the locks panel, for
tests/test_debug_toolbar.py: the tests' settings plus the toolbar's app and middleware,
shown to every request; its URLs are ``tests/debug_toolbar_urls.py``."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, MIDDLEWARE

DEBUG = True
INSTALLED_APPS = [*INSTALLED_APPS, "django.contrib.staticfiles", "debug_toolbar"]
MIDDLEWARE = ["debug_toolbar.middleware.DebugToolbarMiddleware", *MIDDLEWARE]
ROOT_URLCONF = "tests.debug_toolbar_urls"
STATIC_URL = "/static/"
# (Settings cannot import the toolbar, which needs the apps loaded: the timer panel
# beside the locks panel stands for the toolbar's own.)
DEBUG_TOOLBAR_PANELS = [
    "debug_toolbar.panels.timer.TimerPanel",
    "django_distlock.contrib.debug_toolbar.LocksPanel",
]
DEBUG_TOOLBAR_CONFIG = {"SHOW_TOOLBAR_CALLBACK": lambda request: True,
                        "IS_RUNNING_TESTS": False}
