"""Redlock over the 5 independent Redis masters that scripts/test starts: the shipped
contract, the majority rule (held by a minority elsewhere, masters down, a frozen
master), validity less the drift, configuration."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from django_distlock import locks
from django_distlock.backends.redis import RedlockBackend
from django_distlock.exceptions import BackendUnavailable, InvalidBackendOptions, LockLost
from django_distlock.testing import LockContract

from .conftest import require_redis
from .private_redis import Server, _free_port

URLS = [url for url in os.environ.get("DISTLOCK_REDLOCK_URLS", "").split(",") if url]


class TestRedlock(LockContract):
    alias = "redlock"

    @pytest.fixture(autouse=True)
    def _redis(self) -> None:
        require_redis(redlock=True)


@pytest.fixture
def masters() -> Iterator[list[redis.Redis]]:
    require_redis(redlock=True)
    clients = [redis.Redis.from_url(url) for url in URLS]
    yield clients
    for client in clients:
        client.close()


def dead_url() -> str:
    return f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens there


def own(location: list[str], **options: Any) -> RedlockBackend:
    return RedlockBackend("own", {"LOCATION": location, "OPTIONS": options, "TTL": 10})


def test_a_lock_is_held_by_a_majority_of_the_masters(masters: list[redis.Redis], unique) -> None:
    backend = locks["redlock"]
    assert isinstance(backend, RedlockBackend)
    name = unique()
    with backend.lock(name, ttl=10) as lease:
        assert lease.fencing_token is None  # independent counters cannot be ordered
        key = backend.calls_for(backend.make_key(name)).keys.lock
        assert sum(int(m.exists(key)) for m in masters) == 5
    assert sum(int(m.exists(key)) for m in masters) == 0


def test_a_minority_held_elsewhere_does_not_stop_a_grant_a_majority_does(
    masters: list[redis.Redis], unique
) -> None:
    backend = locks["redlock"]
    assert isinstance(backend, RedlockBackend)
    name = unique()
    key = backend.calls_for(backend.make_key(name)).keys.lock
    foreign = "f" * 32 + " 1 1 1 host 1 thread"
    for master in masters[:2]:
        master.set(key, foreign, px=10_000)
    handle = backend.lock(name, ttl=10)
    assert handle.acquire(blocking=False)
    handle.release()
    for master in masters[:2]:  # the foreign holder's entries are not ours to free
        assert master.get(key) == foreign.encode()
    masters[2].set(key, foreign, px=10_000)
    assert not handle.acquire(blocking=False)
    # a failed attempt gives back what it got on the other masters
    assert [int(m.exists(key)) for m in masters] == [1, 1, 1, 0, 0]
    for master in masters[:3]:
        master.delete(key)


def test_two_of_five_masters_down_still_grant_three_down_is_a_clear_error(unique) -> None:
    require_redis(redlock=True)
    backend = own([*URLS[:3], dead_url(), dead_url()])
    try:
        with backend.lock(unique(), ttl=5) as lease:
            assert lease.held
            lease.extend(5)
            assert lease.held
        backend.health()
    finally:
        backend.close()
    backend = own([*URLS[:2], dead_url(), dead_url(), dead_url()])
    try:
        began = time.monotonic()
        with pytest.raises(BackendUnavailable, match="only 2 of 5"):
            backend.lock(unique(), ttl=5).acquire(timeout=1)
        assert time.monotonic() - began < 1.5
        with pytest.raises(BackendUnavailable):
            backend.health()
    finally:
        backend.close()


def test_a_frozen_master_costs_its_node_timeout_not_the_acquire(tmp_path: Path, unique) -> None:
    require_redis(redlock=True)
    server = Server(tmp_path)
    server.start()
    backend = own([*URLS[:2], server.url(), URLS[2], URLS[3]], NODE_TIMEOUT=0.2)
    try:
        server.pause()
        began = time.monotonic()
        with backend.lock(unique(), ttl=5) as lease:
            assert lease.held
        assert time.monotonic() - began < 2.0  # acquire + release: 0.2 s each on it
    finally:
        server.resume()
        server.kill()
        backend.close()


def test_the_lease_counts_as_shorter_by_the_clock_drift(unique) -> None:
    require_redis(redlock=True)
    handle = locks["redlock"].lock(unique(), ttl=1)
    began = time.monotonic()
    assert handle.acquire()
    try:
        time.sleep(max(began + 0.9 - time.monotonic(), 0))
        assert not handle.lost
        # valid until the first request + 1 s - (1% of 1 s + 2 ms): before began + 0.995
        time.sleep(max(began + 0.995 - time.monotonic(), 0))
        assert handle.lost
    finally:
        handle.release() if not handle.lost else None


def test_a_lease_that_ended_cannot_be_released_or_extended(masters, unique) -> None:
    backend = locks["redlock"]
    assert isinstance(backend, RedlockBackend)
    name = unique()
    handle = backend.lock(name, ttl=10)
    assert handle.acquire()
    key = backend.calls_for(backend.make_key(name)).keys.lock
    for master in masters[:3]:  # the lease ended on a majority
        master.delete(key)
    with pytest.raises(LockLost):
        handle.extend(10)


@pytest.mark.parametrize(
    ("location", "message"),
    [
        (None, "at least 3"),
        ("redis://127.0.0.1:1/0", "at least 3"),
        (["redis://a", "redis://b"], "at least 3"),
        (["redis://a", "http://b", "redis://c"], "not a redis"),
        (["redis://a", "redis://a", "redis://c"], "twice"),
    ],
)
def test_bad_locations_are_clear_errors(location: Any, message: str) -> None:
    with pytest.raises(InvalidBackendOptions, match=message):
        RedlockBackend("bad", {"LOCATION": location})


@pytest.mark.parametrize(
    "options", [{"NODE_TIMEOUT": 0}, {"NODE_TIMEOUT": True}, {"FAIR": True}]
)
def test_bad_options_are_clear_errors(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidBackendOptions):
        RedlockBackend("bad", {"LOCATION": "redis://a,redis://b,redis://c", "OPTIONS": options})


def test_a_comma_separated_location_and_the_node_timeout_reach_the_clients() -> None:
    backend = RedlockBackend(
        "cfg",
        {"LOCATION": "redis://a:1/0, redis://b:2/0?socket_timeout=3,redis://c:3/0"},
    )
    assert backend.quorum == 2
    locations = [master.location or "" for master in backend.masters]
    assert "socket_timeout=0.1" in locations[0]
    assert "socket_timeout=3" in locations[1] and "socket_timeout=0.1" not in locations[1]
