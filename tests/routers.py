"""The test settings' database router: Django's own apps (users, groups, permissions,
content types, admin log, sessions) have their tables on ``default`` only.

The tests use those models on ``default`` alone (the admin's user, its log); the servers'
test databases (PostgreSQL, MariaDB) hold the library's and the test apps' tables. So
the flush after a transactional test that lists every database makes Django's content
types and permissions again on ``default`` only (its ``post_migrate`` handlers ask this
router), not on each server: about 55 ms saved per server and test (CONTRIBUTING.md,
"The tiers").
"""

from __future__ import annotations

from typing import Any

#: Django's apps kept on ``default``.
DJANGO_APPS = frozenset({"auth", "contenttypes", "admin", "sessions"})


class DjangoAppsOnDefault:
    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label in DJANGO_APPS:
            return db == "default"
        return None
