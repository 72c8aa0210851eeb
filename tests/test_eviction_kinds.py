"""tests/test_redis_eviction.py for the kinds (issue 22): a reader's or a permit's keys on
a Redis that evicts are evicted as a holder's key is, so the first read lock, write lock
or permit of an alias is refused on such a server too, before anything is written.

Each test starts its own ``redis-server`` (``own_redis``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_distlock.backends.redis import RedisBackend
from django_distlock.backends.redis.kinds import share_keys
from django_distlock.exceptions import LockConfigurationError

from .figures import record
from .kinds_catalogue import KINDS, of_kind
from .private_redis import Server


@pytest.fixture
def admin(own_redis: Server) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis.url())
    yield client
    client.close()


def _backend(server: Server, **options: Any) -> RedisBackend:
    return RedisBackend("own", {"LOCATION": server.url(), "OPTIONS": options, "TTL": 30})


@pytest.mark.parametrize("kind", KINDS)
def test_the_first_lock_of_a_kind_on_an_evicting_server_is_refused(
        own_redis: Server, admin: redis.Redis, kind: str) -> None:
    admin.config_set("maxmemory", 100_000_000)
    admin.config_set("maxmemory-policy", "volatile-lru")
    backend = _backend(own_redis)
    try:
        handle = of_kind(backend, kind, "refused", ttl=30)
        with pytest.raises(LockConfigurationError, match="maxmemory-policy volatile-lru"):
            handle.acquire(blocking=False)
        assert not handle.held and admin.keys("*") == []  # nothing granted
    finally:
        backend.close()


def test_an_evicted_readers_keys_let_a_writer_in(own_redis: Server, admin: redis.Redis) -> None:
    """Why: told to accept eviction, a cache filling the server evicts a reader's keys and
    a writer is granted while the reader still holds."""
    backend = _backend(own_redis, ALLOW_EVICTION=True)
    try:
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", used + 2_000_000)
        admin.config_set("maxmemory-policy", "allkeys-lru")
        reader = backend.read_lock("evicted", ttl=60)
        assert reader.acquire(blocking=False)
        keys = backend.keys_for(backend.make_key("evicted"))
        held = [keys.lock, *share_keys(keys)]
        assert admin.exists(*held) >= 2
        blob, filled = b"x" * 10_000, 0
        for filled in range(2_000):  # a cache filling the server: 20 MB into 2 MB
            admin.set(f"cache:{filled}", blob)
            if not admin.exists(*held):
                break
        assert not admin.exists(*held)
        writer = backend.write_lock("evicted", ttl=60)
        assert writer.acquire(blocking=False)  # beside the reader
        assert reader.held and writer.held
    finally:
        backend.close()
    record("eviction-kinds", "redis/read", processes=1, acquisitions=2, overlaps=1,
           cache_keys_written=filled + 1, allow_eviction=True)
