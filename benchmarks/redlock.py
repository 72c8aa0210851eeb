"""Redlock cases: a lock over the 5 independent masters of ``DISTLOCK_REDLOCK_URLS``.

For orientation beside the one-server rows of :mod:`benchmarks.redis` (no bars:
Redlock pays one round trip per master by design): pottery's ``Redlock`` over
the same 5 masters, and django-distlock's ``RedlockBackend`` (alias ``redlock``,
``benchmarks/settings.py``); a new lock object per acquisition, 30 s lease,
5 s acquire timeout, as in :mod:`benchmarks.redis`.
"""

from __future__ import annotations

import functools
import os
from typing import Any
from urllib.parse import urlsplit

import redis
from pottery import Redlock

from . import asyncio_contended, contention, lockers, uncontended
from .harness import Unavailable, add_case
from .lockers import ACQUIRE_TIMEOUT, TTL, django_setup
from .redis import ALLOWED_HOSTS

GROUP = "redlock"


def _urls() -> list[str]:
    return [url for url in os.environ.get("DISTLOCK_REDLOCK_URLS", "").split(",") if url]


def setup() -> None:
    """Check the targets and free the locks an interrupted run may have left held.

    :raises Unavailable: when no Redlock masters are configured.
    :raises SystemExit: when a master's host is not 127.0.0.1.
    """
    if not _urls():
        raise Unavailable(
            "DISTLOCK_REDLOCK_URLS is not set: run scripts/bench, or export "
            "DISTLOCK_REDLOCK_URLS=redis://127.0.0.1:PORT/0,... (at least 3)"
        )
    for url in _urls():
        host = urlsplit(url).hostname
        if host not in ALLOWED_HOSTS:
            raise SystemExit(f"benchmarks: refusing to target Redis on {host!r}: only 127.0.0.1")
        client = redis.Redis.from_url(url)
        try:
            for key in client.scan_iter(match="*bench:*", count=1000):
                client.delete(key)
        finally:
            client.close()
    django_setup()


def describe() -> str:
    """How many masters."""
    return f"Redlock over {len(_urls())} Redis masters"


class PotteryRedlock5:
    """pottery's ``Redlock(key=key, masters={5 clients}, auto_release_time=30)``."""

    def __init__(self, key: str) -> None:
        self.clients = {redis.Redis.from_url(url) for url in _urls()}
        self.key = key
        self.lock: Any = None

    def acquire(self) -> bool:
        self.lock = Redlock(key=self.key, masters=self.clients, auto_release_time=TTL)
        return bool(self.lock.acquire(timeout=ACQUIRE_TIMEOUT))

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        for client in self.clients:
            client.close()


class DistLock(lockers.DistLock):
    """django-distlock's ``RedlockBackend`` (:class:`benchmarks.lockers.DistLock`)."""


CASES = (
    ("redlock.pottery", PotteryRedlock5, "pottery `Redlock`, 5 masters"),
    (
        "redlock.distlock",
        functools.partial(DistLock, alias="redlock"),
        "django-distlock `RedlockBackend`, 5 masters",
    ),
)
for _suite in (uncontended.NAME, contention.NAME):
    for _name, _factory, _what in CASES:
        add_case(_suite, _name, _factory, _what, group=GROUP)
asyncio_contended.add("redlock.distlock", functools.partial(
    DistLock, alias="redlock", timeout=asyncio_contended.TASK_TIMEOUT
), "django-distlock `RedlockBackend`, 5 masters", group=GROUP)
