"""memcached cases: the raw floor of a lock on memcached and django-distlock's cache backend.

All on the server of ``DISTLOCK_MEMCACHED``. ``cache.floor`` is the least a lock
on memcached costs: pymemcache's ``add`` of a fresh token with a 30 s expiry, then
``delete`` (two round trips; that release does not compare the owner, so it is a
floor, not a safe lock). ``cache.distlock`` is ``locks["cache-memcached"]``
(``CacheBackend`` on a ``PyMemcacheCache`` alias, see ``benchmarks/settings.py``):
``ms ... ME c`` then ``md ... C<cas>`` on the granting connection, one round trip
each, plus the handle's work. The issue's bar: within 1.2x of the floor.
``cache.calls`` makes the same backend's memcached calls with no lock handle
around them (the driver's ``key``, ``add`` and ``release``, a fresh token each
time): (b) minus (c) is the handle's share, measured in the same run.
"""

from __future__ import annotations

import functools
import os
import secrets
from importlib.metadata import version

from pymemcache.client.base import Client

from . import asyncio_contended, lockers, uncontended
from .harness import Unavailable, add_bar, add_case

TTL = lockers.TTL
GROUP = "memcached"
ALLOWED_HOSTS = ("127.0.0.1",)


def _server() -> tuple[str, int]:
    host, _, port = os.environ.get("DISTLOCK_MEMCACHED", "").rpartition(":")
    return host, int(port or 0)


def setup() -> None:
    """Check the target.

    :raises Unavailable: when no memcached is configured.
    :raises SystemExit: when the configured host is not 127.0.0.1.
    """
    if not os.environ.get("DISTLOCK_MEMCACHED"):
        raise Unavailable(
            "DISTLOCK_MEMCACHED is not set: run scripts/bench, or export "
            "DISTLOCK_MEMCACHED=127.0.0.1:PORT for your own server"
        )
    host = _server()[0]
    if host not in ALLOWED_HOSTS:
        raise SystemExit(f"benchmarks: refusing to target memcached on {host!r}: only 127.0.0.1")
    lockers.django_setup()


def describe() -> str:
    """The server's version and the client's."""
    client = Client(_server())
    try:
        server = client.version().decode()
    finally:
        client.close()
    return f"memcached {server}; pymemcache {version('pymemcache')}"


class Floor:
    """(a) pymemcache ``add(key, token, expire=30)`` then ``delete(key)``: two round
    trips, nothing around them."""

    def __init__(self, key: str) -> None:
        self.client, self.key = Client(_server()), key

    def acquire(self) -> bool:
        return bool(self.client.add(self.key, secrets.token_hex(16), expire=int(TTL),
                                    noreply=False))

    def release(self) -> None:
        self.client.delete(self.key, noreply=False)

    def close(self) -> None:
        self.client.close()


class DistLock(lockers.DistLock):
    """(b) django-distlock through its public API (:class:`benchmarks.lockers.DistLock`)."""


class Calls:
    """(c) the cache backend's own calls for one grant and its release, no handle."""

    def __init__(self, key: str) -> None:
        lockers.django_setup()
        from django_distlock import locks

        self.locks, backend = locks, locks["cache-memcached"]
        self.driver, self.lock_key = backend.driver(), backend.make_key(key)
        self.key, self.token, self.stamp = "", "", None

    def acquire(self) -> bool:
        self.key, self.token = self.driver.key(self.lock_key), secrets.token_hex(16)
        stored, self.stamp = self.driver.add(self.key, self.token, TTL, True)
        return bool(stored)

    def release(self) -> None:
        self.driver.release(self.key, self.token, self.stamp)

    def close(self) -> None:
        self.locks.close_all()


_U = uncontended.NAME
add_case(_U, "cache.floor", Floor, "(a) pymemcache `add` + `delete`, raw", group=GROUP,
         reference="floor")
add_case(_U, "cache.distlock", functools.partial(DistLock, alias="cache-memcached"),
         "(b) django-distlock, `CacheBackend` on `PyMemcacheCache`", group=GROUP)
add_case(_U, "cache.calls", Calls,
         "(c) the same backend's memcached calls, no lock handle", group=GROUP)
add_bar(_U, "cache.distlock", "cache.floor", 1.2)
asyncio_contended.add("cache.distlock", functools.partial(
    DistLock, alias="cache-memcached", timeout=asyncio_contended.TASK_TIMEOUT
), "django-distlock, `CacheBackend` on `PyMemcacheCache`", group=GROUP)
