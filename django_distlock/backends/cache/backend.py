"""``CacheBackend``: locks on a Django cache alias (memcached or Redis) via its atomic add."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from django.core import checks

from ...exceptions import InvalidBackendOptions, LockConfigurationError
from ...kinds import Kind
from ..base import BaseLockBackend, Freed, check_option_keys
from .acquisition import CacheAcquisition
from .driver import Driver
from .errors import CACHE_ERRORS
from .kinds import cache_kind


class CacheBackend(BaseLockBackend):
    """Locks on the Django cache ``OPTIONS["CACHE"]`` (default ``"default"``).

    A grant is the cache's atomic add of the owner's token with the lease as its TTL;
    release, extend and force release compare the holder in the server (memcached: the
    item's CAS value; Redis: the token in a script). Caches that cannot do both are
    refused (system check ``distlock.E030``, and :class:`LockConfigurationError` at first
    use). See docs/cache.md for what it does not promise: evictions, restarts.
    """

    kinds = {Kind.EXCLUSIVE: CacheAcquisition}
    errors = CACHE_ERRORS
    distributed = True
    supports_expiry = True
    supports_force_release = True
    supports_force_release_by_owner = True
    why_unsupported = {
        "supports_listing": (
            "a cache cannot list its keys at a cost bounded by the page (memcached cannot "
            "list keys at all; a Redis SCAN walks the whole keyspace)"
        ),
        "supports_waiters": (
            "its waiters retry with backoff in their own processes; a cache keeps no "
            "queue of them"
        ),
        "supports_fencing": (
            "a counter in a cache can be evicted or lost in a restart apart from the lock, "
            "so its numbers would not always grow"
        ),
        "supports_leadership": (
            "a term's epoch is a fencing token, which a cache cannot keep growing (use the "
            "Redis or the database backend)"
        ),
    }

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        check_option_keys(alias, self.options, {"CACHE"})
        if self.location is not None:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['LOCATION']: the cache backend uses the servers of "
                "CACHES[OPTIONS['CACHE']]; remove LOCATION."
            )
        #: The ``CACHES`` alias the locks live on.
        self.cache_alias: Any = self.options.get("CACHE", "default")
        if not isinstance(self.cache_alias, str):
            raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]['OPTIONS']['CACHE'] must be a str.")
        self._driver: Driver | None = None
        self._mutex = threading.Lock()

    def driver(self) -> Driver:
        """The driver of the cache's kind, built at first use.

        :returns: the driver.
        :raises LockConfigurationError: when the cache cannot hold a lock safely.
        """
        if self._driver is None:
            with self._mutex:
                if self._driver is None:
                    self._driver = self._build_driver()
        return self._driver

    def _build_driver(self) -> Driver:
        kind, why = cache_kind(self.cache_alias)
        if kind is None:
            raise LockConfigurationError(f"DISTLOCK[{self.alias!r}]: {why}.")
        if kind == "memcached":
            from .memcached import MemcachedDriver

            return MemcachedDriver(self.cache_alias)
        from .rediscache import RedisCacheDriver

        return RedisCacheDriver(self.cache_alias)

    def is_locked(self, name: str) -> bool:
        key = self.make_key(name)
        driver = self.driver()
        return driver.exists(driver.key(key))

    def _force_release(self, key: str, owner: str) -> Freed | None:
        driver = self.driver()
        return Freed() if driver.force_release(driver.key(key), owner) else None

    def health(self) -> float:
        started = time.perf_counter()
        self.driver().ping()
        return time.perf_counter() - started

    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        if kwargs.get("deploy"):
            return []
        kind, why = cache_kind(self.cache_alias)
        if kind is not None:
            return []
        return [
            checks.Error(
                f"DISTLOCK[{self.alias!r}] cannot lock on its cache: {why}.",
                hint="Point OPTIONS['CACHE'] at a PyMemcacheCache or Django RedisCache alias "
                "(docs/cache.md).",
                obj=self.alias,
                id="distlock.E030",
            )
        ]
