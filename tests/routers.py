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
