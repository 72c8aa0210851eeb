"""Redis read-write locks and semaphores, uncontended: django-distlock against the floor
of Redisson-style scripts written by hand, and against its own exclusive lock.

All on the server of ``DISTLOCK_REDIS_URL``. The floor is what Redisson's
``RReadWriteLock`` and ``RPermitExpirableSemaphore`` send: one ``EVALSHA`` to
acquire and one to release (raw redis-py ``evalsha``, a fresh
``secrets.token_hex(16)`` per acquisition, no wait queue, no listing index, no
fencing token). django-distlock's cases go through the public API on the alias
``redis`` (a new handle per acquisition, 30 s lease, 5 s timeout): ``lock``,
``read_lock``, ``write_lock``, ``semaphore(name, 4)``. The issue's bar: each kind
within 1.3x of the exclusive lock's uncontended time.
"""

from __future__ import annotations

import functools
import secrets
import time
from typing import Any

from . import contention, lockers, uncontended
from .harness import add_bar, add_case
from .redis import connect, describe, setup

__all__ = ["describe", "setup"]

GROUP = "redis kinds"
TTL = lockers.TTL

# Redisson's read lock, reduced to its Redis calls: a hash (mode + a counter per owner),
# each owner's lease in a key of its own. KEYS: lock, the owner's lease key.
# ARGV: ttl_ms, owner. nil when granted, else the lock's PTTL.
READ_ACQUIRE = """
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false or mode == 'read' then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2], 1, 'px', ARGV[1])
  if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('pexpire', KEYS[1], ARGV[1])
  end
  return nil
end
return redis.call('pttl', KEYS[1])
"""
# KEYS: lock, the owner's lease key, the wake channel. ARGV: owner.
READ_RELEASE = """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return nil end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) == 0 then redis.call('hdel', KEYS[1], ARGV[1]) end
redis.call('del', KEYS[2])
if redis.call('hlen', KEYS[1]) == 1 then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[3], 0)
end
return 1
"""
# Redisson's write lock. KEYS: lock. ARGV: ttl_ms, owner.
WRITE_ACQUIRE = """
if redis.call('hget', KEYS[1], 'mode') == false then
  redis.call('hset', KEYS[1], 'mode', 'write', ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
"""
# KEYS: lock, the wake channel. ARGV: owner.
WRITE_RELEASE = """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return nil end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], 0)
return 1
"""
# Redisson's permit-expirable semaphore: a sorted set of permits by expiry; the number
# of permits in a key. KEYS: permits, limit key. ARGV: now_ms, ttl_ms, owner, limit.
SEM_ACQUIRE = """
redis.call('setnx', KEYS[2], ARGV[4])
redis.call('zremrangebyscore', KEYS[1], 0, ARGV[1])
if redis.call('zcard', KEYS[1]) < tonumber(redis.call('get', KEYS[2])) then
  redis.call('zadd', KEYS[1], ARGV[1] + ARGV[2], ARGV[3])
  return 1
end
return nil
"""
# KEYS: permits, the wake channel. ARGV: owner.
SEM_RELEASE = """
if redis.call('zrem', KEYS[1], ARGV[1]) == 0 then return nil end
redis.call('publish', KEYS[2], 0)
return 1
"""


class Floor:
    """Redisson-style scripts for one ``kind``: one ``EVALSHA`` to acquire, one to release."""

    def __init__(self, key: str, *, kind: str) -> None:
        self.client, self.key, self.kind = connect(), key, kind
        self.ttl_ms, self.token = int(TTL * 1000), ""
        acquire, release = {
            "read": (READ_ACQUIRE, READ_RELEASE),
            "write": (WRITE_ACQUIRE, WRITE_RELEASE),
            "semaphore": (SEM_ACQUIRE, SEM_RELEASE),
        }[kind]
        self.acquire_sha = self.client.script_load(acquire)
        self.release_sha = self.client.script_load(release)
        self.channel = f"{key}:wake"

    def acquire(self) -> bool:
        self.token = secrets.token_hex(16)
        key, c = self.key, self.client
        if self.kind == "read":
            lease = f"{key}:r:{self.token}"
            return c.evalsha(self.acquire_sha, 2, key, lease, self.ttl_ms, self.token) is None
        if self.kind == "write":
            return c.evalsha(self.acquire_sha, 1, key, self.ttl_ms, self.token) is None
        # Redisson passes the client's clock; the scripts do not call TIME
        now = int(time.time() * 1000)
        limit_key = f"{key}:limit"
        return bool(
            c.evalsha(self.acquire_sha, 2, key, limit_key, now, self.ttl_ms, self.token, 4)
        )

    def release(self) -> None:
        key, c = self.key, self.client
        if self.kind == "read":
            lease = f"{key}:r:{self.token}"
            c.evalsha(self.release_sha, 3, key, lease, self.channel, self.token)
        else:
            c.evalsha(self.release_sha, 2, key, self.channel, self.token)

    def close(self) -> None:
        self.client.close()


class Kind(lockers.DistLock):
    """django-distlock's ``kind`` through the public API, a new handle per acquisition."""

    def __init__(self, key: str, *, kind: str) -> None:
        super().__init__(key, alias="redis")
        self.kind = kind

    def _handle(self) -> Any:
        backend = self.locks[self.alias]
        options = {"ttl": TTL, "timeout": self.timeout}
        if self.kind == "semaphore":
            return backend.semaphore(self.key, 4, **options)
        if self.kind == "read":
            return backend.read_lock(self.key, **options)
        if self.kind == "write":
            return backend.write_lock(self.key, **options)
        return backend.lock(self.key, **options)


def _factory(cls: type, kind: str) -> Any:
    """A picklable factory (the contended suite spawns its workers)."""
    return functools.partial(cls, kind=kind)


_U = uncontended.NAME
add_case(
    _U, "redis_kinds.exclusive", _factory(Kind, "exclusive"),
    "django-distlock `lock()` (the bar's reference)", group=GROUP, reference="exclusive",
)
for _kind, _what in (("read", "read lock"), ("write", "write lock"), ("semaphore", "semaphore")):
    add_case(
        _U, f"redis_kinds.floor-{_kind}", _factory(Floor, _kind),
        f"Redisson-style {_what}: one `EVALSHA` each way (floor)", group=GROUP,
    )
    add_case(
        _U, f"redis_kinds.{_kind}", _factory(Kind, _kind),
        f"django-distlock `{'semaphore(name, 4)' if _kind == 'semaphore' else _kind + '_lock()'}`",
        group=GROUP,
    )
    add_bar(_U, f"redis_kinds.{_kind}", "redis_kinds.exclusive", 1.3)
    add_bar(_U, f"redis_kinds.{_kind}", f"redis_kinds.floor-{_kind}", None)
_C = contention.NAME
add_case(
    _C, "redis_kinds.exclusive", _factory(Kind, "exclusive"),
    "django-distlock `lock()` (the rate's reference)", group=GROUP,
)
add_case(
    _C, "redis_kinds.semaphore", _factory(Kind, "semaphore"),
    "django-distlock `semaphore(name, 4)`: 4 permits", group=GROUP, at_once=4,
)
add_bar(_C, "redis_kinds.semaphore", "redis_kinds.exclusive", None, metric="rate")
