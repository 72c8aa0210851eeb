"""The Redis caches whose connections the backend reuses (``OPTIONS["CACHE"]``): which
caches qualify, their sync client, and an asyncio client with the same settings."""

from __future__ import annotations

import inspect
from typing import Any

import redis.asyncio
from django.core.cache import caches

from ...exceptions import LockConfigurationError
from .sentinel import async_master_like, is_sentinel_pool

#: Cache backends whose connection the backend can reuse (subclasses too).
DJANGO_REDIS_CACHE = "django_redis.cache.RedisCache"
DJANGO_BUILTIN_CACHE = "django.core.cache.backends.redis.RedisCache"

_sync, _async = redis.connection, redis.asyncio.connection
#: Sync connection class -> its asyncio twin (the most derived match wins: SSL first).
_ASYNC_CONNECTIONS = {
    _sync.SSLConnection: _async.SSLConnection,
    _sync.UnixDomainSocketConnection: _async.UnixDomainSocketConnection,
    _sync.Connection: _async.Connection,
}
#: The settings of a sync connection that its asyncio twin takes over (the others,
#: parser classes, retry and maintenance objects, are sync-only).
_MIRRORED = {
    "host",
    "port",
    "db",
    "username",
    "password",
    "path",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "client_name",
    "credential_provider",
    "health_check_interval",
    "protocol",
}


def cache_client(alias: str) -> Any:
    """The sync client of the Redis cache ``alias`` (django-redis or Django's own)."""
    problem = cache_problem(alias)
    if problem:
        raise LockConfigurationError(problem)
    cache: Any = caches[alias]
    if hasattr(cache, "client") and hasattr(cache.client, "get_client"):  # django-redis
        return cache.client.get_client(write=True)
    return cache._cache.get_client(write=True)  # Django's RedisCache


def cache_problem(alias: object) -> str | None:
    """Say what makes ``alias`` unusable as the cache to reuse, or None (no I/O)."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    if not isinstance(alias, str) or alias not in settings.CACHES:
        known = sorted(getattr(settings, "CACHES", {}))
        return f"OPTIONS['CACHE'] names {alias!r}, which is not a cache alias (CACHES has {known})."
    path = settings.CACHES[alias].get("BACKEND", "")
    try:
        cls = import_string(path)
    except ImportError as exc:
        return f"CACHES[{alias!r}]['BACKEND'] {path!r} cannot be imported: {exc}"
    for redis_path in (DJANGO_REDIS_CACHE, DJANGO_BUILTIN_CACHE):
        try:
            if issubclass(cls, import_string(redis_path)):
                return None
        except ImportError:
            continue
    return (
        f"CACHES[{alias!r}] uses {path}, not Redis: OPTIONS['CACHE'] must name a "
        f"{DJANGO_REDIS_CACHE} or {DJANGO_BUILTIN_CACHE} cache."
    )


def async_client_like(pool: Any, alias: str) -> Any:
    """A ``redis.asyncio`` client with the connection settings of the sync ``pool`` of
    the cache ``alias`` (host, db, credentials, timeouts, TLS files).

    :raises LockConfigurationError: for a connection class it cannot mirror.
    """
    sync_class = pool.connection_class
    async_class = next(
        (a for s, a in _ASYNC_CONNECTIONS.items() if issubclass(sync_class, s)), None
    )
    if async_class is None:
        raise LockConfigurationError(
            f"CACHES[{alias!r}] uses connections of {sync_class.__name__}, which the "
            "Redis lock backend cannot mirror for asyncio; set LOCATION instead."
        )
    accepted = _init_params(async_class)
    given = pool.connection_kwargs
    kwargs = {
        k: v
        for k, v in given.items()
        if k in accepted and (k in _MIRRORED or k.startswith("ssl_"))
    }
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name not in kwargs and "orig_" + name in given:  # redis-py 8 keeps them there
            kwargs[name] = given["orig_" + name]
    if is_sentinel_pool(pool):  # django-redis' SentinelClient: the master moves
        return async_master_like(pool, kwargs, issubclass(sync_class, _sync.SSLConnection))
    return redis.asyncio.Redis(
        connection_pool=redis.asyncio.ConnectionPool(connection_class=async_class, **kwargs)
    )


def _init_params(cls: type) -> set[str]:
    params: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            params.update(inspect.signature(init).parameters)
    return params
