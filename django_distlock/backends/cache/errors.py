"""How the cache backend's two clients fail, and what each failure becomes
(:data:`CACHE_ERRORS`, the backend's ``errors``).

Each driver is its client's boundary: :mod:`.memcached` catches
:data:`MEMCACHED_ERRORS` (closing the client unless the server only lacked a command),
:mod:`.rediscache` catches :data:`REDIS_CACHE_ERRORS`; both raise
``CACHE_ERRORS.translate(exc, where=cache_alias) from exc``. The clients are the
extras' (pymemcache, redis-py): one that is not installed has no errors to catch.
"""

from __future__ import annotations

from ...exceptions import BackendUnavailable, DistLockError, LockConfigurationError
from ..base import ErrorMap

_UnknownCommand: type[BaseException] | None
try:
    from pymemcache.exceptions import MemcacheError, MemcacheUnknownCommandError
except ImportError:  # pragma: no cover - the memcached extra not installed
    MEMCACHED_ERRORS: tuple[type[BaseException], ...] = ()
    _UnknownCommand = None
else:
    MEMCACHED_ERRORS = (MemcacheError, OSError)
    _UnknownCommand = MemcacheUnknownCommandError
try:
    from redis import RedisError
except ImportError:  # pragma: no cover - the redis extra not installed
    REDIS_CACHE_ERRORS: tuple[type[BaseException], ...] = ()
else:
    REDIS_CACHE_ERRORS = (RedisError,)


class CacheErrors(ErrorMap):
    """A memcached server without the meta commands is a
    :class:`LockConfigurationError` (it needs memcached 1.6); any other error of either
    client is :class:`BackendUnavailable`, naming the server's kind (an ``OSError``
    comes from pymemcache's sockets). ``where`` is the cache alias."""

    def translate(
        self, exc: BaseException, doing: str = "", where: str = ""
    ) -> DistLockError | LockConfigurationError:
        if _UnknownCommand is not None and isinstance(exc, _UnknownCommand):
            return LockConfigurationError(
                f"CACHES[{where!r}]: the memcached server does not know the meta "
                "commands; the cache lock backend needs memcached 1.6 or later."
            )
        server = "Redis" if isinstance(exc, REDIS_CACHE_ERRORS) else "memcached"
        during = f" while {doing}" if doing else ""
        return BackendUnavailable(f"{server} (cache {where!r}) failed{during}: {exc}")


#: The cache backend's error map (``CacheBackend.errors``).
CACHE_ERRORS = CacheErrors(MEMCACHED_ERRORS + REDIS_CACHE_ERRORS)
