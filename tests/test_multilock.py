"""multi_lock(names): all-or-nothing over any backend's exclusive locks, in one fixed
order (no deadlock between multi-locks over overlapping names in opposite orders)."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from django_distlock import distlock, locks, signals
from django_distlock.backends.redis import RedisBackend
from django_distlock.exceptions import BackendUnavailable, LockLost, LockNotHeld, LockTimeout
from django_distlock.handle import hold_of

from .conftest import in_thread, require_redis, require_zookeeper
from .private_redis import Server

ALIASES = ["locmem", "zk"]


@pytest.fixture(params=ALIASES)
def backend(request):
    if request.param == "zk":
        require_zookeeper()
    return locks[request.param]


def test_takes_all_in_key_order(backend, unique) -> None:
    names = [unique("c"), unique("a"), unique("b"), unique("a")]
    multi = backend.multi_lock(names)
    assert [h.name for h in multi.handles] == sorted(set(names))  # KEY_PREFIX is shared
    with multi:
        assert multi.held and set(multi.fencing_tokens) == set(names)
        for name in names:
            assert in_thread(lambda name=name: backend.lock(name).acquire(blocking=False)) is False
    for name in names:
        assert not backend.is_locked(name)
    with pytest.raises(LockNotHeld):
        multi.release()


def test_all_or_nothing(backend, unique) -> None:
    a, b, c = unique("a"), unique("b"), unique("c")
    with backend.lock(b):  # the middle one is taken
        def attempt() -> tuple[bool, bool, bool]:
            multi = backend.multi_lock([a, b, c], timeout=0.3)
            got = multi.acquire()
            return got, backend.is_locked(a), backend.is_locked(c)

        assert in_thread(attempt) == (False, False, False)  # a was given back

        def with_block() -> type:
            try:
                with backend.multi_lock([a, b], timeout=0.1):
                    return type(None)
            except LockTimeout as exc:
                return type(exc)

        assert in_thread(with_block) is LockTimeout


def test_opposite_orders_never_deadlock(backend, unique) -> None:
    """Rounds started together by a barrier, in opposite orders; taken in a fixed order,
    every round gets both (taken in the given order, rounds would deadlock until the
    timeout and fail)."""
    a, b = unique("a"), unique("b")
    results: list[bool] = []
    start = threading.Barrier(2, timeout=30)

    def loop(names: list[str]) -> None:
        for _ in range(20):
            start.wait()
            multi = backend.multi_lock(names, timeout=1)
            got = multi.acquire()
            results.append(got)
            if got:
                multi.release()

    threads = [threading.Thread(target=loop, args=(n,)) for n in ([a, b], [b, a])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == [True] * 40


def test_a_lost_member_is_reported_after_releasing_the_others(backend, unique) -> None:
    a, b = unique("a"), unique("b")
    multi = backend.multi_lock([a, b])
    multi.acquire()
    hold_of(multi.handles[0]).mark_lost()
    assert multi.lost
    with pytest.raises(LockLost):
        multi.release()
    assert not backend.is_locked(a) and not backend.is_locked(b)


def test_async(backend, unique) -> None:
    a, b = unique("a"), unique("b")

    async def main() -> bool:
        async with backend.multi_lock([b, a]) as multi:
            return multi.held and backend.is_locked(a) and backend.is_locked(b)

    assert asyncio.run(main()) is True
    assert not backend.is_locked(a)


def test_bad_arguments() -> None:
    backend = locks["locmem"]
    with pytest.raises(TypeError):
        backend.multi_lock("ab")
    with pytest.raises(ValueError):
        backend.multi_lock([])
    with pytest.raises(ValueError):
        backend.multi_lock(["a", "b\x00"])


def test_decorator_takes_a_list_of_names(backend, unique) -> None:
    """``@distlock([...])``: every name of the call or none, sync and async."""
    prefix = unique("")

    @distlock([prefix + "stock:{sku}", prefix + "order:{order}"], using=backend.alias, timeout=2)
    def pay(sku: str, order: int) -> list[bool]:
        return [backend.is_locked(name) for name in pay.lock_name(sku, order)]

    @distlock(
        [prefix + "order:{order}", prefix + "stock:{sku}"], using=backend.alias,
        blocking=False, on_fail="skip", skip_value="busy",
    )
    async def refund(sku: str, order: int) -> str:
        return "done"

    assert pay.lock_name("x", 7) == [prefix + "stock:x", prefix + "order:7"]
    assert pay("x", 7) == [True, True]
    assert not backend.is_locked(prefix + "stock:x")
    holder = backend.lock(prefix + "stock:x")
    with holder:  # one of the names held elsewhere: nothing is taken
        assert in_thread(lambda: asyncio.run(refund("x", 7))) == "busy"
        assert not backend.is_locked(prefix + "order:7")
    assert asyncio.run(refund("x", 7)) == "done"


def test_decorator_list_needs_exclusive_templates() -> None:
    with pytest.raises(ValueError, match="exclusive"):
        distlock(["a:{x}", "b:{x}"], using="locmem", kind="read")(lambda x: x)
    with pytest.raises(TypeError):
        distlock([], using="locmem")(lambda x: x)
    with pytest.raises(TypeError):
        distlock(["a:{x}", 3], using="locmem")(lambda x: x)
    with pytest.raises(ValueError, match="'y'"):
        distlock(["a:{x}", "b:{y}"], using="locmem")(lambda x: x)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_member_whose_release_fails_does_not_stop_the_others(
    tmp_path: Path, asynchronous: bool
) -> None:
    """A private Redis freezes after the first member's release (c): the next one (b)
    raises BackendUnavailable; the server thaws and the last one (a) is released all the
    same. The error names b, is chained to b's, and b stays taken: release() again
    releases it (it stopped at b: a stayed held and a retry raised LockNotHeld)."""
    require_redis()
    server = Server(tmp_path)
    server.start()
    url = server.url("socket_timeout=1&socket_connect_timeout=1")
    backend = RedisBackend("own", {"LOCATION": url, "TTL": 30})
    lost: list[str] = []

    def freeze_after_c(sender: Any, **kwargs: Any) -> None:
        if kwargs["backend"] is backend and kwargs["name"] == "c":
            server.pause()

    def record_lost(sender: Any, **kwargs: Any) -> None:
        lost.append(kwargs["name"])

    class ThawAfterAFailure(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            server.resume()  # (the release of b failed: let the others through)

    thaw = ThawAfterAFailure(logging.WARNING)
    try:
        with backend.lock("warm", ttl=30):  # the scripts are loaded before the freeze
            pass
        multi = backend.multi_lock(["b", "c", "a"], ttl=30)
        assert multi.acquire()
        signals.lock_released.connect(freeze_after_c, weak=False)
        signals.lock_lost.connect(record_lost, weak=False)
        logging.getLogger("django_distlock").addHandler(thaw)
        try:
            with pytest.raises(BackendUnavailable) as caught:
                if asynchronous:
                    asyncio.run(multi.arelease())
                else:
                    multi.release()
        finally:
            logging.getLogger("django_distlock").removeHandler(thaw)
            signals.lock_released.disconnect(freeze_after_c)
            server.resume()
        assert "['b']" in str(caught.value)
        assert isinstance(caught.value.__cause__, BackendUnavailable)
        assert not backend.is_locked("a") and not backend.is_locked("c")
        assert not multi.held
        multi.release()  # b (which the thawed server may have released already)
        assert not backend.is_locked("b")
        with pytest.raises(LockNotHeld):
            multi.release()
        assert lost == []
    finally:
        signals.lock_lost.disconnect(record_lost)
        backend.close()
        server.kill()
