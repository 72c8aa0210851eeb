"""System checks of the ``DISTLOCK`` setting (ids ``distlock.E001`` ...)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .handler import DEFAULT_LOCK_ALIAS, LockHandler, locks

if TYPE_CHECKING:
    from .backends.database import DatabaseBackend


@checks.register("distlock")
def check_distlock(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Build every alias' backend (no I/O) and gather its messages."""
    try:
        aliases = LockHandler.configure(getattr(settings, "DISTLOCK", None))
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="distlock.E003")]
    messages: list[checks.CheckMessage] = []
    if DEFAULT_LOCK_ALIAS not in aliases:
        messages.append(
            checks.Error(
                f"DISTLOCK has no {DEFAULT_LOCK_ALIAS!r} alias.",
                hint="Add one; decorators and lock() use it unless given using=.",
                id="distlock.E001",
            )
        )
    for alias in aliases:
        try:
            backend = locks.create_backend(alias)
        except ImproperlyConfigured as exc:
            cause = exc.__cause__
            import_failed = isinstance(cause, ImportError) or "BaseLockBackend" in str(exc)
            check_id = "distlock.E002" if import_failed else "distlock.E003"
            messages.append(checks.Error(str(exc), obj=alias, id=check_id))
            continue
        messages.extend(backend.check(**kwargs))
    return messages


def database_checks(backend: DatabaseBackend) -> list[checks.CheckMessage]:
    """The checks of one database-backend alias."""
    alias, db = backend.alias, backend.database
    if db not in settings.DATABASES:
        return [
            checks.Error(
                f"DISTLOCK[{alias!r}] uses database {db!r}, which is not in DATABASES.",
                obj=alias,
                id="distlock.E003",
            )
        ]
    messages: list[checks.CheckMessage] = []
    vendor = backend.vendor
    if vendor not in ("postgresql", "sqlite"):
        messages.append(
            checks.Error(
                f"DISTLOCK[{alias!r}]: the database backend serves PostgreSQL and SQLite; "
                f"DATABASES[{db!r}] is {vendor!r}.",
                hint="Use another database alias, or the Redis or ZooKeeper backend.",
                obj=alias,
                id="distlock.E004",
            )
        )
    elif vendor == "sqlite":
        if sqlite3.sqlite_version_info < (3, 35, 0):
            messages.append(
                checks.Error(
                    f"DISTLOCK[{alias!r}] needs SQLite 3.35 or newer (RETURNING and upserts); "
                    f"this Python has {sqlite3.sqlite_version}.",
                    obj=alias,
                    id="distlock.E004",
                )
            )
        name = str(settings.DATABASES[db].get("NAME", ""))
        if name in ("", ":memory:") or "mode=memory" in name:
            messages.append(
                checks.Warning(
                    f"DISTLOCK[{alias!r}] uses an in-memory SQLite database, which no other "
                    "process can see: its locks exclude nothing across processes.",
                    obj=alias,
                    id="distlock.W001",
                )
            )
    if not apps.is_installed("django_distlock"):
        messages.append(
            checks.Error(
                f"DISTLOCK[{alias!r}] uses the database backend, whose table comes with the "
                "'django_distlock' app.",
                hint="Add 'django_distlock' to INSTALLED_APPS and run migrate.",
                obj=alias,
                id="distlock.E005",
            )
        )
    return messages
