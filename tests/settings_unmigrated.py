"""A site whose database never saw ``migrate`` (tests/test_distlock_command.py): its
``DISTLOCK_SQLITE_DIR`` is a new, empty directory."""

from .settings import *  # noqa: F403

_LOCMEM = "django_distlock.backends.locmem.LocMemBackend"
DISTLOCK = {
    "default": {"BACKEND": "django_distlock.backends.database.DatabaseBackend"},
    "audited": {"BACKEND": _LOCMEM, "AUDIT": True},  # its events go to a missing table
    "quiet": {"BACKEND": _LOCMEM},
}
