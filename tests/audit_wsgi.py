"""A WSGI app that audits, for gunicorn (tests/test_audit_recorder.py).

``DISTLOCK_AUDIT_DB`` (JSON) is its ``DATABASES["default"]``. ``GET /lock/N`` takes and
releases the audited lock ``wsgi:N`` (a hold: one row); ``GET /hold/N`` takes
``wsgi:hold:N`` and keeps it (written as ``acquired`` when the worker exits).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_distlock",
                    "django_distlock.contrib.audit"],
    DATABASES={"default": json.loads(os.environ["DISTLOCK_AUDIT_DB"])},
    DISTLOCK={"default": {"BACKEND": "django_distlock.backends.locmem.LocMemBackend",
                          "AUDIT": True}},
    USE_TZ=True,
)  # fmt: skip
django.setup()

from django_distlock import locks  # noqa: E402 - after setup

HELD: list[Any] = []


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Take (and release, or keep) the lock the path names."""
    kind, _, number = environ["PATH_INFO"].strip("/").partition("/")
    name = f"wsgi:hold:{number}" if kind == "hold" else f"wsgi:{number}"
    handle = locks["default"].lock(name, ttl=60)
    handle.acquire()
    if kind == "hold":
        HELD.append(handle)
    else:
        handle.release()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]
