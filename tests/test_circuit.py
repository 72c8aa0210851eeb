"""``FAIL_FAST``: after a lock server failed, acquires and listings fail at once until a
background probe finds it answering (issue 25: a dead ZooKeeper made every request
wait for the connect timeout). Real servers, real refusals, a real paused Redis."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from django.http import HttpResponse
from django.utils.module_loading import import_string

from django_distlock import distlock, locks
from django_distlock.backends.base import BaseLockBackend
from django_distlock.backends.redis import RedisBackend
from django_distlock.exceptions import BackendUnavailable, InvalidBackendOptions
from django_distlock.http import unavailable_response
from django_distlock.testing.faults import unreachable_params

from .conftest import (
    LIBRARY_DB,
    eventually,
    require_pg,
    require_redis,
    require_zookeeper,
)
from .private_redis import Server

pytestmark = LIBRARY_DB


@pytest.fixture
def dead() -> Iterator[object]:
    """``dead(alias, fail_fast)``: a backend of ``alias``' class and settings whose server
    refuses connections (ZooKeeper: connect timeout 1 s), with ``FAIL_FAST``."""
    with ExitStack() as stack:

        def build(alias: str, fail_fast: float) -> BaseLockBackend:
            params = dict(unreachable_params(locks[alias], locks.settings[alias], stack))
            params["FAIL_FAST"] = fail_fast
            backend: BaseLockBackend = import_string(params["BACKEND"])(alias, params)
            stack.callback(backend.close)
            return backend

        yield build


@pytest.fixture
def name(unique) -> str:
    return unique("circuit")


REQUIRE = {"redis": require_redis, "zk": require_zookeeper, "pg-lease": require_pg}


@pytest.mark.parametrize("alias", ["redis", "zk", "pg-lease"])
def test_after_a_failure_acquires_and_listings_fail_at_once(alias: str, dead, name) -> None:
    REQUIRE[alias]()
    backend = dead(alias, 30)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as first:
        backend.lock(name, timeout=1).acquire()
    first_took = time.monotonic() - started
    assert backend.circuit.open and backend.circuit.cause is first.value
    for call in (lambda: backend.lock(name, timeout=1).acquire(),
                 lambda: backend.held_locks()):
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="FAIL_FAST") as refused:
            call()
        # refused by the circuit (chained to the first failure), not by a new attempt
        assert refused.value.__cause__ is first.value
        assert time.monotonic() - started < max(0.2, first_took / 2)


def test_without_fail_fast_every_acquire_tries_the_server(dead, name) -> None:
    require_zookeeper()
    backend = dead("zk", 0)
    for _ in range(2):
        with pytest.raises(BackendUnavailable) as failed:
            backend.lock(name, timeout=1).acquire()
        assert "FAIL_FAST" not in str(failed.value)
    assert not backend.circuit.open


def test_the_probe_closes_the_circuit_when_the_server_answers_again(
    tmp_path: Path, name
) -> None:
    require_redis()
    server = Server(tmp_path)
    server.start()
    backend = RedisBackend("circuit", {
        "LOCATION": server.url("socket_timeout=0.5&socket_connect_timeout=0.5"),
        "FAIL_FAST": 0.2,
    })
    try:
        server.kill()
        with pytest.raises(BackendUnavailable):
            backend.lock(name, timeout=1).acquire()
        assert backend.circuit.open
        with pytest.raises(BackendUnavailable, match="FAIL_FAST"):
            backend.lock(name, timeout=1).acquire()
        server.start()  # the same port
        assert eventually(lambda: not backend.circuit.open, timeout=5), "the probe never closed it"
        handle = backend.lock(name, timeout=1)
        assert handle.acquire()
        handle.release()
    finally:
        backend.close()
        server.kill()


def test_an_open_circuit_never_refuses_the_release_of_a_held_lock(
    tmp_path: Path, name
) -> None:
    """A release refused by a circuit opened by a passing failure would leave the lock
    held until its lease ends: releases, extends and health are never refused."""
    require_redis()
    server = Server(tmp_path)
    server.start()
    backend = RedisBackend("circuit", {
        "LOCATION": server.url("socket_timeout=0.5&socket_connect_timeout=0.5"),
        "FAIL_FAST": 60,  # the probe will not close it during the test
    })
    try:
        held = backend.lock(name, ttl=60)
        assert held.acquire()
        server.pause()
        try:
            with pytest.raises(BackendUnavailable):
                backend.lock(f"{name}:other", timeout=1).acquire()
        finally:
            server.resume()
        assert backend.circuit.open
        held.extend(60)
        held.release()
        assert not backend.is_locked(name)
        assert backend.health() >= 0
    finally:
        backend.close()
        server.kill()


def test_a_forked_child_starts_with_its_circuit_closed(dead, name) -> None:
    require_redis()
    backend = dead("redis", 60)
    with pytest.raises(BackendUnavailable):
        backend.lock(name, timeout=1).acquire()
    assert backend.circuit.open
    pid = os.fork()
    if pid == 0:  # the child: its parent's circuit is not its own
        code = 1
        try:
            backend.lock(name, timeout=1).acquire()
        except BackendUnavailable as exc:
            code = 3 if "FAIL_FAST" in str(exc) else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child was refused by its parent's circuit"


@pytest.mark.parametrize("value", [-1, True, "5", float("nan"), 7200])
def test_a_bad_fail_fast_is_refused_when_the_alias_is_built(value: object) -> None:
    with pytest.raises(InvalidBackendOptions, match="FAIL_FAST"):
        RedisBackend("circuit", {"LOCATION": "redis://127.0.0.1:1/0", "FAIL_FAST": value})


def test_the_decorator_answers_a_down_server_with_its_on_unavailable_policy(
    dead, name
) -> None:
    require_redis()
    broken = dead("redis", 60)
    real = locks["redis"]
    locks["redis"] = broken
    try:
        @distlock(name, using="redis", timeout=1, on_unavailable=unavailable_response)
        def view(request: object) -> HttpResponse:
            return HttpResponse("sold")

        @distlock(name, using="redis", timeout=1, on_unavailable="skip", skip_value="later")
        def task() -> str:
            return "ran"

        @distlock(name, using="redis", timeout=1)
        def strict() -> str:
            return "ran"

        response = view(None)
        assert response.status_code == 503 and response["Retry-After"] == "5"
        assert task() == "later"
        with pytest.raises(BackendUnavailable):
            strict()
    finally:
        locks["redis"] = real
    with pytest.raises(ValueError, match="on_unavailable"):
        distlock(name, on_unavailable="retry")(lambda: None)


def test_a_grant_closes_the_circuit_that_opened_while_it_was_asked_for(name) -> None:
    """A call that gets an answer closes the circuit: so does a sync acquire whose first
    attempt was sent while the circuit was closed and granted after another call's
    failure opened it (that attempt is made outside the acquire loop, which closes it
    after a grant)."""
    from django_distlock.backends.locmem import LocMemAcquisition, LocMemBackend
    from django_distlock.kinds import Kind

    class OpenedMeanwhile(LocMemAcquisition):
        def attempt(self):  # another thread's call fails while this one is under way
            self.backend.circuit.failed(BackendUnavailable("another call failed"))
            return super().attempt()

    backend = LocMemBackend("circuit-locmem", {
        "BACKEND": "django_distlock.backends.locmem.LocMemBackend", "FAIL_FAST": 3600})
    backend.kinds = {**backend.kinds, Kind.EXCLUSIVE: OpenedMeanwhile}
    handle = backend.lock(name)
    assert handle.acquire()
    assert not backend.circuit.open  # the probe waits 3600 s: the grant closed it
    handle.release()
