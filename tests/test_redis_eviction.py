"""A Redis that evicts keys when full can evict a held lock's key: the backend asks
the server its ``maxmemory-policy`` (``check --deploy``, the first acquire of an alias
in a process, ``health()``) and refuses one that evicts, unless told to accept it.

Each test starts its own ``redis-server`` (``tests/test_redis_faults.py``'s
:class:`Server`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_distlock.backends.redis import RedisBackend
from django_distlock.exceptions import LockConfigurationError
from django_distlock.health import check_health

from .figures import record
from .private_redis import Server


@pytest.fixture
def server(own_redis: Server) -> Server:
    return own_redis


@pytest.fixture
def admin(server: Server) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url())
    yield client
    client.close()


def _backend(server: Server, **options: Any) -> RedisBackend:
    return RedisBackend("own", {"LOCATION": server.url(), "OPTIONS": options, "TTL": 30})


def test_an_evicting_server_grants_a_held_lock_again(server: Server, admin: redis.Redis) -> None:
    """Why the backend refuses such a server: a cache writer filling it evicts the
    holder's key, and a second holder is granted while the first still holds."""
    backend = _backend(server, ALLOW_EVICTION=True)
    try:
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", used + 2_000_000)
        admin.config_set("maxmemory-policy", "allkeys-lru")
        holder = backend.lock("evicted", ttl=60)
        assert holder.acquire(blocking=False)
        lock_key = backend.keys_for(backend.make_key("evicted")).lock
        blob = b"x" * 10_000
        for i in range(2_000):  # a cache filling the server: 20 MB into 2 MB
            admin.set(f"cache:{i}", blob)
            if not admin.exists(lock_key):
                break
        assert not admin.exists(lock_key)
        second = backend.lock("evicted", ttl=60)
        assert second.acquire(blocking=False)  # both hold now
        record("eviction", "redis (ALLOW_EVICTION)", overlaps=int(holder.held and second.held))
        assert holder.held and second.held
    finally:
        backend.close()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "volatile-ttl"])
def test_first_use_of_an_evicting_server_is_refused(
    server: Server, admin: redis.Redis, policy: str
) -> None:
    admin.config_set("maxmemory", 100_000_000)
    admin.config_set("maxmemory-policy", policy)
    backend = _backend(server)
    try:
        handle = backend.lock("refused", ttl=30)
        with pytest.raises(LockConfigurationError, match=f"maxmemory-policy {policy}"):
            handle.acquire(blocking=False)
        assert not handle.held
        assert admin.keys("*") == []  # nothing granted
        admin.config_set("maxmemory-policy", "noeviction")  # fixed: no restart needed
        assert handle.acquire(blocking=False)
        handle.release()
    finally:
        backend.close()


def test_an_evicting_server_is_accepted_when_told(server: Server, admin: redis.Redis) -> None:
    admin.config_set("maxmemory", 100_000_000)
    admin.config_set("maxmemory-policy", "allkeys-lru")
    backend = _backend(server, ALLOW_EVICTION=True)
    try:
        with backend.lock("accepted", ttl=30) as handle:
            assert handle.held
        assert backend.check(deploy=True) == []
        assert backend.health() >= 0
    finally:
        backend.close()


def test_without_maxmemory_no_key_is_evicted_and_the_server_is_accepted(
    server: Server, admin: redis.Redis
) -> None:
    admin.config_set("maxmemory-policy", "allkeys-lru")  # maxmemory 0: no limit
    backend = _backend(server)
    try:
        with backend.lock("unlimited", ttl=30) as handle:
            assert handle.held
        assert backend.check(deploy=True) == []
    finally:
        backend.close()


def test_deploy_check_and_health_name_an_evicting_server(
    server: Server, admin: redis.Redis
) -> None:
    admin.config_set("maxmemory", 100_000_000)
    admin.config_set("maxmemory-policy", "allkeys-lru")
    alias = {"BACKEND": "django_distlock.backends.redis.RedisBackend", "LOCATION": server.url()}
    with override_settings(DISTLOCK={"default": alias}):
        from django_distlock.checks import check_distlock, check_distlock_deploy

        assert check_distlock() == []  # no I/O without --deploy
        (error,) = check_distlock_deploy()
        assert error.id == "distlock.E011"
        assert "maxmemory-policy allkeys-lru" in error.msg and "noeviction" in error.hint
        (health,) = check_health()
        assert not health.ok
        assert "LockConfigurationError" in health.error and "allkeys-lru" in health.error
        admin.config_set("maxmemory-policy", "noeviction")
        assert check_distlock_deploy() == []
        (health,) = check_health()
        assert health.ok


def test_deploy_check_warns_when_the_server_cannot_be_asked(server: Server) -> None:
    url = server.url("socket_timeout=1&socket_connect_timeout=1")
    server.kill()
    backend = RedisBackend("own", {"LOCATION": url})
    try:
        (warning,) = backend.check(deploy=True)
        assert warning.id == "distlock.W011"
        assert "could not ask" in warning.msg
    finally:
        backend.close()
