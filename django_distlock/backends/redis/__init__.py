"""The Redis lock backends: :class:`~.backend.RedisBackend` (one server or a Redis
Cluster; :class:`~.backend.UnlistedRedisBackend` where ``OPTIONS["LISTING"]`` is
False) and :class:`~.redlock.RedlockBackend` (a majority of independent masters).
See ``docs/redis.md``."""

from .backend import RedisBackend, UnlistedRedisBackend
from .redlock import RedlockBackend

__all__ = ["RedisBackend", "RedlockBackend", "UnlistedRedisBackend"]
