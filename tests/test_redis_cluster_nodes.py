"""A Redis Cluster reached through several startup nodes, some of them down, and
every cluster client error mapped to ``BackendUnavailable``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from redis.exceptions import RedisClusterException

from django_distlock.backends.redis import RedisBackend
from django_distlock.exceptions import BackendUnavailable, InvalidBackendOptions

from .conftest import require_redis
from .private_redis import _free_port

CLUSTER_URL = os.environ.get("DISTLOCK_REDIS_CLUSTER_URL", "")


def _dead_url() -> str:
    return f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens there


async def _hold_and_release(backend: RedisBackend, name: str) -> int | None:
    handle = backend.lock(name, ttl=10)
    assert await handle.aacquire(timeout=5)
    token = handle.fencing_token
    await handle.arelease()
    return token


@pytest.mark.parametrize("form", ["list", "string"])
def test_a_cluster_is_reached_through_any_live_startup_node(form: str, unique) -> None:
    """The first node named is down (its master failed over, or the host is gone):
    a new process still finds the cluster through the next one."""
    require_redis(cluster=True)
    urls = [_dead_url(), CLUSTER_URL]
    location: Any = urls if form == "list" else ", ".join(urls)
    backend = RedisBackend(
        "nodes", {"LOCATION": location, "OPTIONS": {"CLUSTER": True}, "KEY_PREFIX": "kn:"}
    )
    try:
        name = unique("nodes")
        handle = backend.lock(name, ttl=10)
        assert handle.acquire(timeout=5)
        assert backend.is_locked(name)
        assert [info.name for info in backend.held_locks(prefix=name)] == [name]
        handle.release()
        assert backend.health() >= 0
        assert asyncio.run(_hold_and_release(backend, name)) is not None
    finally:
        backend.close()


def test_an_unreachable_cluster_is_backend_unavailable_on_every_path(unique) -> None:
    """redis-py raises RedisClusterException (not a RedisError) when no startup node
    answers: every call maps it to BackendUnavailable, chained to it."""
    backend = RedisBackend("nodes", {"LOCATION": _dead_url(), "OPTIONS": {"CLUSTER": True}})
    name = unique("down")
    calls = {
        "acquire": lambda: backend.lock(name, ttl=5).acquire(blocking=False),
        "blocking acquire": lambda: backend.lock(name, ttl=5).acquire(timeout=1),
        "is_locked": lambda: backend.is_locked(name),
        "held_locks": lambda: backend.held_locks(),
        "force_release": lambda: backend.force_release(name),
        "health": backend.health,
        "async acquire": lambda: asyncio.run(backend.lock(name, ttl=5).aacquire(blocking=False)),
    }
    try:
        for what, call in calls.items():
            with pytest.raises(BackendUnavailable) as caught:
                call()
            assert isinstance(caught.value.__cause__, RedisClusterException), what
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"LOCATION": ["redis://a:1/0", "redis://b:1/0"]}, "CLUSTER"),
        ({"LOCATION": "redis://a:1/0,redis://b:1/0"}, "CLUSTER"),
        (
            {"LOCATION": ["redis://a:1/0", "unix:///tmp/r.sock"], "OPTIONS": {"CLUSTER": True}},
            "redis:// or rediss://",
        ),
        ({"LOCATION": ["redis://a:1/0", 7], "OPTIONS": {"CLUSTER": True}}, "URL"),
        ({"LOCATION": [], "OPTIONS": {"CLUSTER": True}}, "URL"),
        ({"LOCATION": ["redis://a:1/0", "redis://a:1/0"], "OPTIONS": {"CLUSTER": True}}, "twice"),
    ],
)
def test_bad_startup_node_lists_are_clear_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidBackendOptions, match=message):
        RedisBackend("nodes", params)
