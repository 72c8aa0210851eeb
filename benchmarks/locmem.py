"""locmem cases: django-distlock's process-local backend (``locks["locmem"]``).

Only suite ``asyncio`` has a row of it: its locks exclude the threads and tasks of one
process, so the suite runs the tasks process alone for it (no thread processes).
"""

from __future__ import annotations

import functools

from . import asyncio_contended, lockers

GROUP = "locmem"


def setup() -> None:
    """Set Django up; nothing else to check (no server)."""
    lockers.django_setup()


def describe() -> str:
    """No server: the locks live in the measuring process."""
    return "locmem (process-local, no server)"


class DistLock(lockers.DistLock):
    """django-distlock's ``LocMemBackend`` (:class:`benchmarks.lockers.DistLock`)."""


asyncio_contended.add("locmem.distlock", functools.partial(
    DistLock, alias="locmem", timeout=asyncio_contended.TASK_TIMEOUT
), "django-distlock `LocMemBackend` (tasks process alone)", group=GROUP)
