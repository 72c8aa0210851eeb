"""The settings of a helper process whose locks (locmem) are audited to a given database
(tests/audit_exit.py, tests/order_taker.py): its own settings, not tests.settings', so
that it starts quickly and writes only to the test's database."""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings


def configure(database: dict[str, Any], **extra: Any) -> None:
    """Configure Django with ``database`` as ``default`` and one audited locmem alias, plus
    ``extra`` settings, and set it up."""
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_distlock",
                        "django_distlock.contrib.audit"],
        DATABASES={"default": database},
        DISTLOCK={"default": {"BACKEND": "django_distlock.backends.locmem.LocMemBackend",
                              "AUDIT": True}},
        USE_TZ=True,
        **extra,
    )
    django.setup()
