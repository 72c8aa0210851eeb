"""The test settings' database router: Django's users, groups, permissions, admin log
and sessions have their tables on ``default`` only.

The tests use those models on ``default`` alone (the admin's user, its log); the servers'
test databases (PostgreSQL, MariaDB) hold the library's and the test apps' tables, and
content types (a generic foreign key reads them from its object's database). So the
flush after a transactional test that lists every database makes Django's permissions
again on ``default`` only (``post_migrate``'s handler asks this router), not on each
server (CONTRIBUTING.md, "The tiers").
"""

from __future__ import annotations

from typing import Any

#: Django's apps kept on ``default``.
DJANGO_APPS = frozenset({"auth", "admin", "sessions"})


class DjangoAppsOnDefault:
    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label in DJANGO_APPS:
            return db == "default"
        return None


#: ``CACHES`` aliases' database tables (tests/settings.py) and the database each lives on.
CACHE_TABLES = {"distlock_fill_pg": "pg", "distlock_fill_mysql": "mysql"}


class CacheTablesByName:
    """Each ``DatabaseCache`` of the test settings on the database its table names
    (``distlock_fill_pg`` on ``pg``...), the others on ``default``: Django routes every
    cache table through one model label, ``django_cache``, so the table tells them apart."""

    def _db(self, model: Any) -> str | None:
        if model._meta.app_label != "django_cache":
            return None
        return CACHE_TABLES.get(model._meta.db_table, "default")

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._db(model)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._db(model)

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        model = hints.get("model")
        if app_label != "django_cache" or model is None:
            return None
        return db == self._db(model)
