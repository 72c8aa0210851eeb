"""What the lock cases of several modules share: Django set up in a worker, and
django-distlock driven through its public API.

A case's factory must be defined in its own module (the harness sets up the
modules of the chosen cases by the factory's ``__module__``): subclass
:class:`DistLock` there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_distlock import Lock

#: Lease length of every acquisition (long enough never to expire during a run).
TTL = 30.0
#: How long a blocking acquire waits before giving up (every case alike).
ACQUIRE_TIMEOUT = 5.0


def django_setup() -> None:
    """Set Django up in this process (a spawned worker starts without it)."""
    from django.apps import apps

    if not apps.ready:
        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
        django.setup()


class SelectOne:
    """(a) One ``SELECT 1`` round trip on a connection from ``connect`` (a DB-API driver's):
    the floor under any statement; release does nothing."""

    def __init__(self, key: str, *, connect: Callable[[], Any]) -> None:
        self.conn = connect()
        self.cursor = self.conn.cursor()

    def acquire(self) -> bool:
        self.cursor.execute("SELECT 1")
        self.cursor.fetchone()
        return True

    def release(self) -> None:
        return None

    def close(self) -> None:
        self.conn.close()


class DistLock:
    """django-distlock through its public API, a new handle per acquisition.

    ``locks[alias].lock(key, ttl=..., timeout=...)`` then ``acquire()``
    (blocking, with the timeout) and ``release()``: what a user's code does;
    ``aacquire()`` and ``arelease()`` are what a user's asyncio task does.
    """

    def __init__(self, key: str, *, alias: str, timeout: float = ACQUIRE_TIMEOUT) -> None:
        django_setup()
        from django_distlock import locks

        self.locks, self.alias, self.key, self.timeout = locks, alias, key, timeout
        self.handle: Lock | None = None

    def _handle(self) -> Lock:
        """A new handle for the next acquisition (subclasses build other kinds)."""
        return self.locks[self.alias].lock(self.key, ttl=TTL, timeout=self.timeout)

    def acquire(self) -> bool:
        self.handle = self._handle()
        return self.handle.acquire()

    def release(self) -> None:
        assert self.handle is not None
        self.handle.release()

    async def aacquire(self) -> bool:
        self.handle = self._handle()
        return await self.handle.aacquire()

    async def arelease(self) -> None:
        assert self.handle is not None
        await self.handle.arelease()

    def close(self) -> None:
        from django.db import connections

        self.locks.close_all()
        connections.close_all()
