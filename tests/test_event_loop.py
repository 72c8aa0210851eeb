"""What a lock call does on the event loop's thread (issue 26's asyncio bar: the loop's
lag under 1,000 tasks): no file read when a Redis pool opens a connection, no thread hop
and no polling for the process-local backend."""

from __future__ import annotations

import asyncio
import importlib.metadata
import threading
import time
from typing import Any

import pytest

from django_distlock import locks
from django_distlock.backends.locmem import LocMemAcquisition
from django_distlock.backends.redis.client import ASYNC_CALLS

from .conftest import require_redis


@pytest.mark.parametrize("alias", ["redis", "redis-cache"])
def test_opening_redis_connections_reads_no_package_metadata_on_the_loop(
    alias: str, unique: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py resolves its version (``importlib.metadata``: a file read and a parse,
    about 1 ms) in every connection's constructor unless the pool gives it: 40 tasks
    acquiring at once open a connection each, on the loop's thread."""
    require_redis()
    real, on_loop = importlib.metadata.version, []

    def version(name: str) -> str:
        try:
            asyncio.get_running_loop()
            on_loop.append(name)
        except RuntimeError:
            pass
        return real(name)

    # The alias' first acquire in a process asks the server (a sync INFO: the backend's
    # eviction check); done here, before the loop, it is not what this test looks at.
    with locks[alias].lock(unique("first"), ttl=10):
        pass
    monkeypatch.setattr(importlib.metadata, "version", version)
    handles = [locks[alias].lock(unique(f"n{i}"), ttl=10, timeout=5) for i in range(40)]

    async def main() -> list[bool]:
        got = await asyncio.gather(*(h.aacquire() for h in handles))
        await asyncio.gather(*(h.arelease() for h in handles if h.held))
        return got

    assert asyncio.run(main()) == [True] * 40
    assert on_loop == []


def _spy(monkeypatch: pytest.MonkeyPatch, method: str) -> list[threading.Thread]:
    """Record the thread of each call of ``LocMemAcquisition.<method>``."""
    real, threads = getattr(LocMemAcquisition, method), []

    def spy(self: LocMemAcquisition, *args: Any) -> Any:
        threads.append(threading.current_thread())
        return real(self, *args)

    monkeypatch.setattr(LocMemAcquisition, method, spy)
    return threads


def test_locmem_tasks_call_the_store_on_the_loop_thread(
    unique: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is in memory and never blocks: a worker thread per call (and the GIL
    hand-offs with it) cost the loop more than the call."""
    attempts, releases = _spy(monkeypatch, "attempt"), _spy(monkeypatch, "release")
    name = unique()

    async def one() -> None:
        handle = locks["locmem"].lock(name, ttl=10, timeout=5)
        assert await handle.aacquire()
        await asyncio.sleep(0.001)
        await handle.arelease()

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(20)))

    asyncio.run(main())
    assert len(releases) == 20 and len(attempts) >= 20
    assert set(attempts) | set(releases) == {threading.main_thread()}


def test_a_locmem_release_wakes_a_waiting_task_which_does_not_poll(
    unique: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task waiting behind a 30 s lease attempts again when the release wakes it, not on
    a backoff schedule (2 ms, 4 ms, 8 ms, ...: some eight attempts in 0.4 s)."""
    attempts = _spy(monkeypatch, "attempt")
    name = unique()

    async def main() -> float:
        holder = locks["locmem"].lock(name, ttl=30)
        assert await holder.aacquire()
        waiter = locks["locmem"].lock(name, ttl=30, timeout=10)
        waiting = asyncio.ensure_future(waiter.aacquire())
        await asyncio.sleep(0.4)
        released = time.monotonic()
        await holder.arelease()
        assert await waiting
        granted = time.monotonic() - released
        await waiter.arelease()
        return granted

    granted = asyncio.run(main())
    assert len(attempts) <= 3  # the holder's, the waiter's first, the one the release woke
    assert granted < 0.25  # woken at once (a lost wake-up would wait its 0.5-1 s recheck)


def test_an_event_loop_keeps_at_most_async_calls_redis_calls_in_flight(unique: Any) -> None:
    """200 tasks acquiring at once: their calls queue in the loop, ``ASYNC_CALLS`` on the
    wire at a time (a pool's worth in flight makes each turn of the loop handle that many
    replies), and every one is granted."""
    require_redis()
    handles = [locks["redis"].lock(unique(f"n{i}"), ttl=10, timeout=5) for i in range(200)]

    async def main() -> tuple[list[bool], int]:
        got = await asyncio.gather(*(h.aacquire() for h in handles))
        await asyncio.gather(*(h.arelease() for h in handles if h.held))
        pool = locks["redis"].redis.aio().connection_pool
        return got, len(pool._available_connections) + len(pool._in_use_connections)

    got, opened = asyncio.run(main())
    assert got == [True] * 200
    assert opened <= ASYNC_CALLS


def test_the_redis_eviction_check_of_a_first_aacquire_runs_off_the_loop(unique: Any) -> None:
    """An alias' first acquire in a process asks the server whether it evicts keys (a
    blocking ``INFO``): from ``aacquire()`` it runs in a worker thread, not on the loop
    (where a frozen server would hold every task of the loop)."""
    require_redis()
    from django.conf import settings

    from django_distlock.backends.redis import RedisBackend

    backend = RedisBackend("fresh", {"LOCATION": settings.DISTLOCK["redis"]["LOCATION"]})
    real, threads = backend.eviction_problem, []

    def eviction_problem(timeout: float | None = None) -> str | None:
        threads.append(threading.get_ident())
        return real(timeout)

    backend.eviction_problem = eviction_problem  # type: ignore[method-assign]

    async def main() -> int:
        async with backend.lock(unique("first"), ttl=10, timeout=5):
            pass
        return threading.get_ident()

    try:
        loop_thread = asyncio.run(main())
    finally:
        backend.close()
    assert len(threads) == 1 and threads[0] != loop_thread
