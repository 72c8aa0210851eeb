"""Fenced writes of cache entries: store an entry unless the cache already holds one built
under a later grant, as one atomic step on the caches that can compare.

Django's cache API has no compare-and-set, so each cache kind gets the one its
server offers:

============================================  ==========================================
cache                                         the compare and the write
============================================  ==========================================
``django_redis.cache.RedisCache``             ``WATCH`` the key, read, ``MULTI``/``SET``/
(its default client), Django's ``RedisCache``  ``EXEC`` (retried if the key changed)
``PyMemcacheCache``                           ``gets``, then ``cas`` (or ``add`` when the
                                              key is missing), retried likewise
``DatabaseCache``                             the key's row locked (``SELECT ... FOR
                                              UPDATE``; SQLite: its write lock), read,
                                              then ``set``/``add`` in that transaction
``LocMemCache``                               read and write under one process-wide lock
anything else                                 read, compare, write: **not atomic** (a
                                              later grant's write may land in between)
============================================  ==========================================

Writes without a fencing token (built without the lock, or on an alias without
tokens) compare nothing and are plain ``cache.set()`` calls. Errors of the cache
itself propagate as the cache raises them (as Django's ``get_or_set`` lets them).
"""

from __future__ import annotations

import base64
import math
import pickle
import threading
from typing import Any, Final

from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.db import DatabaseCache
from django.core.cache.backends.locmem import LocMemCache
from django.db import connections, router, transaction

from .entry import Entry, supersedes

#: How many times a compare-and-set is tried again after another writer changed the
#: key between its read and its write (each retry means a concurrent write landed).
TRIES: Final = 8

#: Fenced writes to process-local caches, one at a time.
_LOCAL = threading.Lock()


def write(
    cache: BaseCache, key: str, version: int | None, entry: Entry, timeout: float | None
) -> bool:
    """Store ``entry`` at ``key`` for ``timeout`` seconds (None: no expiry) unless the
    cache holds an entry built under a later grant of the same alias.

    :param cache: the Django cache object.
    :param key: the key, as given to ``cache.set()``.
    :param version: the key's version (None: the cache's).
    :param entry: the entry (its alias and token are the writer's).
    :param timeout: the entry's lifetime in the cache, in seconds, or None.
    :returns: True when stored; False when dropped (a later grant's entry is there,
        or other writers kept changing the key for :data:`TRIES` attempts).
    """
    alias, token = entry[4], entry[5]
    if token is None:
        cache.set(key, entry, timeout, version=version)
        return True
    if isinstance(cache, LocMemCache):
        with _LOCAL:
            return _read_compare_set(cache, key, version, entry, timeout, alias, token)
    if isinstance(cache, DatabaseCache):
        return _database(cache, key, version, entry, timeout, alias, token)
    redis = _redis_calls(cache)
    if redis is not None:
        return _redis(cache, key, version, entry, timeout, alias, token, *redis)
    if type(cache).__name__ == "PyMemcacheCache":
        return _memcached(cache, key, version, entry, timeout, alias, token)
    return _read_compare_set(cache, key, version, entry, timeout, alias, token)


def atomic(cache: BaseCache) -> bool:
    """Whether :func:`write` compares and writes as one step on ``cache`` (the table
    above).

    :param cache: the Django cache object.
    :returns: False for a cache only the read-compare-write fallback serves.
    """
    return (
        isinstance(cache, LocMemCache | DatabaseCache)
        or _redis_calls(cache) is not None
        or type(cache).__name__ == "PyMemcacheCache"
    )


def _read_compare_set(
    cache: BaseCache, key: str, version: int | None, entry: Entry, timeout: float | None,
    alias: str | None, token: int,
) -> bool:
    if supersedes(cache.get(key, version=version), alias, token):
        return False
    cache.set(key, entry, timeout, version=version)
    return True


# -- Redis ---------------------------------------------------------------------


def _redis_calls(cache: BaseCache) -> tuple[Any, Any, Any] | None:
    """``(client of key, dumps, loads)`` of a Redis cache this module writes through;
    None for any other cache (or django-redis with a client that packs values itself,
    such as its herd client)."""
    module = type(cache).__module__
    if module == "django.core.cache.backends.redis":
        inner = cache._cache  # type: ignore[attr-defined]
        serializer = inner._serializer
        return (
            lambda key: inner.get_client(key, write=True), serializer.dumps, serializer.loads
        )
    if module.startswith("django_redis."):
        from django_redis.client import DefaultClient

        client = cache.client  # type: ignore[attr-defined]
        if type(client) is not DefaultClient:
            return None
        return (lambda key: client.get_client(write=True), client.encode, client.decode)
    return None


def _redis(
    cache: BaseCache, key: str, version: int | None, entry: Entry, timeout: float | None,
    alias: str | None, token: int, client_of: Any, dumps: Any, loads: Any,
) -> bool:
    from redis.exceptions import WatchError

    full = cache.make_and_validate_key(key, version=version)
    data = dumps(entry)
    millis = None if timeout is None else max(1, math.ceil(timeout * 1000))
    with client_of(full).pipeline(transaction=True) as pipe:
        for _ in range(TRIES):
            try:
                pipe.watch(full)  # EXEC fails if another client writes the key from here
                raw = pipe.get(full)
                if raw is not None and supersedes(loads(raw), alias, token):
                    pipe.unwatch()
                    return False
                pipe.multi()
                pipe.set(full, data, px=millis)
                pipe.execute()
                return True
            except WatchError:
                continue
    return False


# -- memcached -----------------------------------------------------------------


def _memcached(
    cache: BaseCache, key: str, version: int | None, entry: Entry, timeout: float | None,
    alias: str | None, token: int,
) -> bool:
    client = cache._cache  # type: ignore[attr-defined]  # pymemcache's HashClient
    full = cache.make_and_validate_key(key, version=version)
    # Whole seconds, rounded up: memcached would read 0.5 s (made 0) as "expire now".
    expire = cache.get_backend_timeout(None if timeout is None else math.ceil(timeout))
    for _ in range(TRIES):
        found = client.gets(full)
        if not isinstance(found, tuple):  # the server failed (the client ignores errors)
            return False
        current, cas = found
        if current is None:
            if client.add(full, entry, expire, noreply=False):
                return True
            continue  # another writer added it first: compare with theirs
        if supersedes(current, alias, token):
            return False
        if client.cas(full, entry, cas, expire, noreply=False):
            return True
    return False


# -- database ------------------------------------------------------------------


def _database(
    cache: DatabaseCache, key: str, version: int | None, entry: Entry, timeout: float | None,
    alias: str | None, token: int,
) -> bool:
    db = router.db_for_write(cache.cache_model_class)
    connection = connections[db]
    full = cache.make_and_validate_key(key, version=version)
    quote = connection.ops.quote_name
    table, column = quote(cache._table), quote("cache_key")  # type: ignore[attr-defined]
    for _ in range(TRIES):
        with transaction.atomic(using=db), connection.cursor() as cursor:
            if connection.features.has_select_for_update:
                cursor.execute(
                    f"SELECT {quote('value')} FROM {table} WHERE {column} = %s FOR UPDATE",
                    [full],
                )
            else:  # SQLite: a write takes the database's write lock before the read
                cursor.execute(
                    f"UPDATE {table} SET {quote('expires')} = {quote('expires')} "
                    f"WHERE {column} = %s",
                    [full],
                )
                cursor.execute(f"SELECT {quote('value')} FROM {table} WHERE {column} = %s",
                               [full])
            row = cursor.fetchone()
            if row is None:
                # Inserted in a savepoint; False when another writer's insert won
                # (Django's cache swallows the unique violation): compare with theirs.
                if cache.add(key, entry, timeout, version=version):
                    return True
                continue
            if supersedes(pickle.loads(base64.b64decode(row[0])), alias, token):
                return False
            cache.set(key, entry, timeout, version=version)  # the row is locked: ours
            return True
    return False
