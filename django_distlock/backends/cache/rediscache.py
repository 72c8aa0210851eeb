"""Locks on Redis through a Django ``RedisCache`` alias: its client, small Lua scripts.

Django's ``RedisCache.add()`` counts TTLs in whole seconds and stores pickles; the
lock instead sends ``SET key token NX PX ttl`` through the cache's own client (the
same atomic add, in milliseconds), and compares the owner in the server: release
and extend are scripts that act only while the key still holds this owner's token,
so a lock another owner took after an expiry is never deleted or prolonged.
"""

from __future__ import annotations

import math
from typing import Any

from .driver import Driver
from .errors import CACHE_ERRORS, REDIS_CACHE_ERRORS

# Set if absent; else the holder's time left (ms), in the same round trip.
ADD = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return -3 end
return redis.call('pttl', KEYS[1])
"""
RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
# ARGV[1]: a short owner id, or "" for any holder (every value starts with "").
FORCE = """
local v = redis.call('get', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class RedisCacheDriver(Driver):
    """Lock calls on a ``django.core.cache.backends.redis.RedisCache`` alias."""

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self._scripts: dict[str, Any] = {}

    def key(self, lock_key: str) -> str:
        key: str = self.cache().make_key("distlock:" + lock_key)
        return key

    def _run(self, source: str, key: str, *args: Any) -> Any:
        client = self.cache()._cache.get_client(key, write=True)
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = client.register_script(source)
        try:
            return script(keys=[key], args=list(args), client=client)
        except REDIS_CACHE_ERRORS as exc:
            raise CACHE_ERRORS.translate(exc, where=self.alias) from exc

    def add(self, key: str, token: str, ttl: float, want_ttl: bool) -> tuple[bool, Any]:
        left = int(self._run(ADD, key, token, math.ceil(ttl * 1000)))
        if left == -3:
            return True, None
        return False, None if left < 0 else left / 1000

    def release(self, key: str, token: str, stamp: Any) -> bool:
        return bool(self._run(RELEASE, key, token))

    def extend(self, key: str, token: str, stamp: Any, ttl: float) -> tuple[bool, Any]:
        return bool(self._run(EXTEND, key, token, math.ceil(ttl * 1000))), None

    def exists(self, key: str) -> bool:
        with CACHE_ERRORS.translating(where=self.alias):
            return bool(self.cache()._cache.get_client(key, write=True).exists(key))

    def force_release(self, key: str, owner: str) -> bool:
        return bool(self._run(FORCE, key, owner))

    def ping(self) -> None:
        with CACHE_ERRORS.translating(where=self.alias):
            self.cache()._cache.get_client(write=True).ping()
