"""The contract every lock backend passes, shipped so that any backend runs it.

Subclass :class:`LockContract` in a pytest module and name the alias under
test; add pytest-django's ``django_db`` mark when the backend uses a database::

    from django_distlock.testing import LockContract

    class TestMyBackend(LockContract):
        alias = "mine"          # configured in the test settings' DISTLOCK

It needs pytest and Django; it makes no assumption about what stores the locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

from ..backends.base import BaseLockBackend
from ..context import holder_context
from ..exceptions import (
    DistLockError,
    InvalidLockName,
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    LockTimeout,
    UnsupportedOperation,
)
from ..handle import SelfDeadlock
from ..handler import locks
from ..renewal import THREADS, loop_schedule
from .signals import signals_sent

BAD_NAMES = ["", "a\x00b", "line\nbreak", "tab\there", "del\x7f", "\ud800"]
BAD_TYPES = [None, 42, b"bytes", ["a"], 1.5]
ODD_NAMES = ["a/b", "a/../b", "..", "/", "/etc/passwd", "spaces and ünïcode ✓", "%s'; --"]


def in_thread(func: Callable[[], Any], timeout: float = 60) -> Any:
    """Run ``func`` in a new thread (its own connections) and return its result."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = func()
        except BaseException as exc:
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the thread did not finish"
    if "error" in box:
        raise box["error"]
    return box.get("result")


class LockContract:
    """Behaviour every backend must show; ``alias`` names the backend under test."""

    alias: str

    @pytest.fixture
    def backend(self) -> BaseLockBackend:
        return locks[self.alias]

    @pytest.fixture
    def unique(self) -> Callable[..., str]:
        """A function making lock names unique to this test."""
        tag = uuid.uuid4().hex[:8]
        return lambda name="lock": f"{name}:{tag}"

    @pytest.fixture
    def events(self, backend: BaseLockBackend) -> Iterator[list[tuple[str, str]]]:
        """The lock signals sent for this backend, as (signal, lock name)."""
        labels = ("lock_acquired", "lock_released", "lock_lost", "lock_force_released")
        with signals_sent(*labels, backend=backend) as seen:
            yield seen

    # -- acquire and release ------------------------------------------------

    def test_acquire_release(self, backend: BaseLockBackend, unique: Callable[..., str]) -> None:
        name = unique()
        handle = backend.lock(name, ttl=30)
        assert not handle.held and handle.fencing_token is None
        assert handle.acquire() is True
        assert handle.held and not handle.lost
        if backend.supports_fencing:
            assert isinstance(handle.fencing_token, int)
        else:
            assert handle.fencing_token is None
        assert handle.locked() is True
        assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
        handle.release()
        assert not handle.held
        assert in_thread(lambda: backend.lock(name).locked()) is False
        assert in_thread(lambda: _acquire_release(backend, name)) is True

    def test_non_blocking_miss_returns_false(self, backend, unique) -> None:
        name = unique()
        with backend.lock(name):
            started = time.monotonic()
            assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
            assert time.monotonic() - started < 5

    def test_timeout_waits_then_returns_false(self, backend, unique) -> None:
        name = unique()
        with backend.lock(name):
            started = time.monotonic()
            assert in_thread(lambda: backend.lock(name).acquire(timeout=0.4)) is False
            assert time.monotonic() - started >= 0.4

    def test_with_raises_when_not_acquired(self, backend, unique) -> None:
        name = unique()

        def attempt(**kwargs: Any) -> type:
            try:
                with backend.lock(name, **kwargs):
                    return type(None)
            except LockNotAcquired as exc:
                assert exc.name == name and exc.alias == backend.alias
                return type(exc)

        with backend.lock(name):
            assert in_thread(lambda: attempt(timeout=0.1)) is LockTimeout
            assert in_thread(lambda: attempt(blocking=False)) is LockNotAcquired

    def test_waiter_gets_the_lock_when_released(self, backend, unique) -> None:
        name = unique()
        holder = backend.lock(name)
        holder.acquire()

        def wait() -> bool:
            handle = backend.lock(name)
            got = handle.acquire(timeout=10)
            handle.release()
            return got

        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(in_thread(wait)))
        waiter.start()
        time.sleep(0.3)
        holder.release()
        waiter.join(15)
        assert result == [True]

    def test_release_not_held(self, backend, unique) -> None:
        handle = backend.lock(unique())
        with pytest.raises(LockNotHeld):
            handle.release()
        handle.acquire()
        handle.release()
        with pytest.raises(LockNotHeld):
            handle.release()

    def test_handle_holds_one_acquisition_at_a_time(self, backend, unique) -> None:
        handle = backend.lock(unique())
        handle.acquire()
        with pytest.raises(DistLockError):
            handle.acquire()
        handle.release()
        assert handle.acquire() is True
        handle.release()

    # -- expiry and extend ---------------------------------------------------

    def test_lease_expires_on_the_server(self, backend, unique) -> None:
        name = unique()
        handle = backend.lock(name, ttl=0.3)
        handle.acquire()
        time.sleep(0.45)
        if not backend.supports_expiry:  # held until released, whatever the ttl
            assert not handle.lost
            assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
            handle.release()
            return
        assert handle.lost
        assert in_thread(lambda: _acquire_release(backend, name)) is True
        with pytest.raises(LockLost):
            handle.release()

    def test_extend(self, backend, unique) -> None:
        name = unique()
        handle = backend.lock(name, ttl=0.5)
        handle.acquire()
        token = handle.fencing_token
        handle.extend(5)
        time.sleep(0.7)
        assert not handle.lost
        assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
        assert handle.fencing_token == token
        handle.release()
        with pytest.raises(LockNotHeld):
            handle.extend(5)

    def test_extend_after_expiry_is_lost(self, backend, unique) -> None:
        name = unique()
        handle = backend.lock(name, ttl=0.2)
        handle.acquire()
        time.sleep(0.35)
        if not backend.supports_expiry:
            handle.extend(5)  # still held: extending works
            handle.release()
            return
        assert in_thread(lambda: _acquire_release(backend, name)) is True
        with pytest.raises(LockLost):
            handle.extend(5)
        assert handle.lost

    def test_bad_ttl_and_timeout(self, backend, unique) -> None:
        for bad in (0, -1, float("nan"), float("inf"), 10**9):
            with pytest.raises(ValueError):
                backend.lock(unique(), ttl=bad)
        for bad_type in ("5", None, True):
            with pytest.raises(TypeError):
                backend.lock(unique(), ttl=bad_type)
        with pytest.raises(ValueError):
            backend.lock(unique(), timeout=-1)
        handle = backend.lock(unique())
        with pytest.raises(ValueError):
            handle.acquire(timeout=-0.5)
        assert handle.acquire() is True  # a refused call changed nothing
        handle.release()

    # -- fencing ----------------------------------------------------------------

    def test_fencing_token_strictly_increases(self, backend, unique) -> None:
        name = unique()
        if not backend.supports_fencing:
            assert _token_of_one_grant(backend, name) is None
            return
        tokens = []
        for _ in range(4):
            tokens.append(in_thread(lambda: _token_of_one_grant(backend, name)))
            tokens.append(_token_of_one_grant(backend, name))
        assert tokens == sorted(set(tokens)), tokens

    # -- listing and force-release ----------------------------------------------

    def test_held_locks_pages(self, backend, unique) -> None:
        base = unique("list")
        names = [f"{base}/{i}" for i in range(3)]
        if not backend.supports_listing:
            with pytest.raises(UnsupportedOperation):
                backend.held_locks(prefix=base)
            return
        handles = [backend.lock(n) for n in names]
        for handle in handles:
            handle.acquire()
        other = backend.lock(unique("elsewhere"))
        other.acquire()
        try:
            first = backend.held_locks(prefix=base + "/", limit=2)
            assert [info.name for info in first] == names[:2]
            assert first.next_cursor is not None
            second = backend.held_locks(prefix=base + "/", limit=2, cursor=first.next_cursor)
            assert [info.name for info in second] == names[2:]
            assert second.next_cursor is None
            info = first.locks[0]
            assert info.alias == backend.alias
            if backend.supports_expiry:
                assert info.owner == handles[0].owner_id and len(info.owner) < 32
                assert info.fencing_token == handles[0].fencing_token
                assert info.pid is not None and info.expires_at > info.acquired_at
        finally:
            for handle in reversed([*handles, other]):
                handle.release()
        assert list(backend.held_locks(prefix=base + "/")) == []

    def test_listing_shows_what_the_holder_is_doing(self, backend, unique) -> None:
        """The context ``@distlock`` or ``holder_context()`` sets is stored with the holder
        and listed apart from the thread; hostile text (control characters, the
        separator, 5,000 characters from a URL) is cleaned and cut, never breaking it."""
        if not backend.supports_listing:
            return
        base = unique("ctx")
        plain, busy, hostile = (backend.lock(f"{base}/{i}") for i in range(3))
        plain.acquire()
        with holder_context("GET /orders/7/pay"):
            busy.acquire()
        with holder_context("GET /x\x1f\n\x00/" + "é" * 5000):
            hostile.acquire()
        try:
            infos = list(backend.held_locks(prefix=base + "/"))
        finally:
            for handle in (hostile, busy, plain):
                handle.release()
        assert len(infos) == 3
        if not infos[0].host:  # a backend that cannot tell who holds (transaction mode)
            assert {info.context for info in infos} == {""}
            return
        assert [info.context for info in infos[:2]] == ["", "GET /orders/7/pay"]
        assert {info.thread for info in infos} == {plain.thread}
        context = infos[2].context
        assert context.startswith("GET /x???/éé") and context.endswith("…")
        assert len(plain.thread) + 1 + len(context) <= 255 and context == hostile.context[
            : len(context) - 1
        ] + "…"

    def test_held_locks_validates_arguments(self, backend) -> None:
        with pytest.raises(ValueError):
            backend.held_locks(limit=0)
        with pytest.raises(TypeError):
            backend.held_locks(limit="10")
        with pytest.raises(TypeError):
            backend.held_locks(prefix=None)
        with pytest.raises(InvalidLockName):
            backend.held_locks(prefix="a\x00")

    def test_force_release(self, backend, unique) -> None:
        name = unique()
        handle = backend.lock(name)
        handle.acquire()
        if not backend.supports_force_release:
            with pytest.raises(UnsupportedOperation):
                backend.force_release(name)
            handle.release()
            return
        assert in_thread(lambda: backend.force_release(name)) is True
        assert in_thread(lambda: backend.force_release(name)) is False
        assert in_thread(lambda: _acquire_release(backend, name)) is True
        with pytest.raises(LockLost):
            handle.release()

    def test_force_release_of_the_holder_shown(self, backend, unique) -> None:
        """With ``owner``, only that holder's lock is freed (checked on the server): a
        lock taken by someone else since it was listed stays."""
        name = unique()
        for bad in ("", "0123456", "0123456789", "ABCDEF01", "zzzzzzzz"):
            with pytest.raises(ValueError):
                backend.force_release(name, owner=bad)
        with pytest.raises(TypeError):
            backend.force_release(name, owner=12345678)
        if not backend.supports_force_release:
            return
        first = backend.lock(name)
        first.acquire()
        shown = first.owner_id
        first.release()
        second = backend.lock(name)
        second.acquire()
        try:
            assert second.owner_id != shown
            assert in_thread(lambda: backend.force_release(name, owner=shown)) is False
            assert backend.is_locked(name)
            second.extend()  # still the holder
            now = second.owner_id
            assert in_thread(lambda: backend.force_release(name, owner=now)) is True
            assert not backend.is_locked(name)
        finally:
            with contextlib.suppress(LockLost):
                second.release()
        assert in_thread(lambda: backend.force_release(name, owner=now)) is False

    # -- names ------------------------------------------------------------------

    @pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: repr(n)[:20])
    def test_bad_names_refused_before_any_call(self, backend, name) -> None:
        with pytest.raises(InvalidLockName):
            backend.lock(name)
        with pytest.raises(ValueError):  # InvalidLockName is a ValueError
            backend.force_release(name)

    @pytest.mark.parametrize("name", BAD_TYPES, ids=repr)
    def test_non_string_names_refused(self, backend, name) -> None:
        with pytest.raises(InvalidLockName):
            backend.lock(name)

    def test_odd_names_are_distinct_locks(self, backend, unique) -> None:
        tag = unique("")
        handles = [backend.lock(tag + name) for name in ODD_NAMES]
        for handle in handles:
            assert handle.acquire(blocking=False) is True
        for handle in reversed(handles):  # transaction mode nests: innermost first
            handle.release()

    # -- ownership ---------------------------------------------------------------

    def test_owner_token_is_per_handle(self, backend, unique) -> None:
        name = unique()
        first, second = backend.lock(name), backend.lock(unique("other"))
        assert first.acquire() and second.acquire()
        assert first.owner_id != second.owner_id
        token = first.acquisition.token if first.acquisition else ""
        assert len(token) == 32 and token not in repr(first)  # 128 bits, never shown
        second.release()
        first.release()

    def test_long_names_are_distinct_locks(self, backend, unique) -> None:
        base = unique("long") + "x" * 300
        first, second = backend.lock(base + "1"), backend.lock(base + "2")
        assert first.acquire(blocking=False) and second.acquire(blocking=False)
        assert in_thread(lambda: backend.lock(base + "1").acquire(blocking=False)) is False
        second.release()
        first.release()
        huge = backend.lock(unique("y" * 10_240))  # any length
        assert huge.acquire(blocking=False)
        huge.release()

    def test_self_deadlock_raises_at_once(self, backend, unique) -> None:
        name = unique()
        with backend.lock(name):
            started = time.monotonic()
            with pytest.raises(SelfDeadlock):
                backend.lock(name).acquire(timeout=5)
            assert time.monotonic() - started < 2
            assert backend.lock(name).acquire(blocking=False) is False

    # -- signals, loss, health ----------------------------------------------------

    def test_signals(self, backend, unique, events) -> None:
        name = unique()
        with backend.lock(name):
            pass
        assert events == [("lock_acquired", name), ("lock_released", name)]
        if backend.supports_force_release:
            events.clear()
            handle = backend.lock(name)
            handle.acquire()
            assert backend.force_release(name)
            with pytest.raises(LockLost):
                handle.release()
            assert events == [
                ("lock_acquired", name), ("lock_force_released", name), ("lock_lost", name)
            ]

    def test_mark_lost_makes_the_exit_raise(self, backend, unique, events) -> None:
        name = unique()
        with pytest.raises(LockLost), backend.lock(name) as handle:
            handle.mark_lost()
            handle.mark_lost()  # once is enough
            assert handle.lost and not handle.held
        assert events.count(("lock_lost", name)) == 1
        assert in_thread(lambda: _acquire_release(backend, name)) is True  # released anyway

    def test_a_lost_handle_no_longer_counts_as_held_by_its_thread(self, backend, unique) -> None:
        name = unique()
        with pytest.raises(LockLost), backend.lock(name) as handle:
            handle.mark_lost()  # (a session ended, a renewal failed, a force release)
            # the thread may wait for the name again: not a SelfDeadlock
            other = backend.lock(name)
            if other.acquire(timeout=0.2):
                other.release()

    def test_an_expired_lease_no_longer_counts_as_held_by_its_thread(
        self, backend, unique
    ) -> None:
        """A lease that ran out (on this process' clock) is not held: the thread that
        held it waits for the name again through a new handle (it raised SelfDeadlock
        until that handle's release)."""
        if not backend.supports_expiry:
            return
        name = unique()
        handle = backend.lock(name, ttl=0.3)
        assert handle.acquire()
        time.sleep(0.45)
        assert handle.lost
        other = backend.lock(name, ttl=30)
        assert other.acquire(timeout=5) is True
        other.release()
        with pytest.raises(LockLost):
            handle.release()

    def test_a_dropped_handle_no_longer_counts_as_held_by_its_thread(
        self, backend, unique
    ) -> None:
        """A handle dropped by an exception before its release is not held by the thread
        any more once its lease ended: a new handle of the thread waits for the name
        instead of raising SelfDeadlock. (Where locks do not expire, the dropped lease
        stays held, by the session or the transaction, and SelfDeadlock is right.)"""
        if not backend.supports_expiry:
            return
        name = unique()

        def take_and_fail() -> None:
            handle = backend.lock(name, ttl=0.3)
            assert handle.acquire()
            raise RuntimeError("the critical section failed before its release")

        with contextlib.suppress(RuntimeError):
            take_and_fail()
        gc.collect()  # the handle and its acquisition refer to each other
        other = backend.lock(name, ttl=30)
        assert other.acquire(timeout=5) is True  # once the dropped lease ended
        other.release()

    def test_health_and_close(self, backend, unique) -> None:
        assert backend.health() >= 0
        backend.close()
        assert in_thread(lambda: _acquire_release(backend, unique())) is True
        assert _acquire_release(backend, unique()) is True

    def test_capability_flags_are_declared(self, backend) -> None:
        for flag in ("supports_fencing", "supports_expiry", "supports_listing",
                     "supports_force_release", "distributed"):
            assert isinstance(getattr(type(backend), flag), bool), flag

    def test_bad_cursor_refused_before_any_call(self, backend) -> None:
        if not backend.supports_listing:
            return
        for cursor in ("a\x00", "\ud800"):
            with pytest.raises(ValueError):
                backend.held_locks(cursor=cursor)

    # -- auto_renew (the watchdog) -------------------------------------------------------

    def test_auto_renew_options(self, backend, unique) -> None:
        with pytest.raises(TypeError):
            backend.lock(unique(), auto_renew="yes")
        with pytest.raises(ValueError):
            backend.lock(unique(), max_hold=5)  # without auto_renew
        if not backend.supports_expiry:
            with pytest.raises(UnsupportedOperation):
                backend.lock(unique(), auto_renew=True)
            return
        for bad in (0, -1, float("nan")):
            with pytest.raises(ValueError):
                backend.lock(unique(), auto_renew=True, max_hold=bad)
        with pytest.raises(TypeError):
            backend.lock(unique(), auto_renew=True, max_hold="5")

    def test_auto_renew_keeps_a_short_lease(self, backend, unique, events) -> None:
        """A 0.3 s lease held for 1.3 s: renewed every 0.1 s, nobody else gets it; the
        release stops the renewals (the lock stays free, and no loss is reported)."""
        if not backend.supports_expiry:
            return
        name = unique()
        handle = backend.lock(name, ttl=0.3, auto_renew=True)
        assert handle.acquire()
        assert THREADS.scheduled(handle)
        for _ in range(3):
            time.sleep(0.43)
            assert handle.held and not handle.lost
            assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
        handle.release()
        assert not THREADS.scheduled(handle)
        assert in_thread(lambda: backend.lock(name).locked()) is False
        time.sleep(0.35)
        assert in_thread(lambda: _acquire_release(backend, name)) is True
        assert events.count(("lock_lost", name)) == 0

    def test_auto_renew_async(self, backend, unique, events) -> None:
        """The same for ``async with``: the event loop's renewal task keeps the lease."""
        if not backend.supports_expiry:
            return
        name = unique()

        async def main() -> list[bool]:
            seen = []
            async with backend.lock(name, ttl=0.3, auto_renew=True) as handle:
                schedule = loop_schedule()
                assert schedule.scheduled(handle) and not THREADS.scheduled(handle)
                for _ in range(3):
                    await asyncio.sleep(0.43)
                    other = backend.lock(name)
                    seen.append(handle.held and not await other.aacquire(blocking=False))
            seen.append(not schedule.scheduled(handle))
            await asyncio.sleep(0.35)
            free = backend.lock(name)
            seen.append(await free.aacquire(blocking=False))
            await free.arelease()
            return seen

        try:
            assert asyncio.run(main()) == [True] * 5
        finally:
            _close_async_connections()
        assert events.count(("lock_lost", name)) == 0

    def test_auto_renew_reports_a_force_release(self, backend, unique, events) -> None:
        """A renewal that finds the lock taken away marks the handle lost at once, stops,
        and the ``with`` exit raises LockLost; lock_lost is sent once."""
        if not backend.supports_expiry or not backend.supports_force_release:
            return
        name = unique()
        with pytest.raises(LockLost), backend.lock(name, ttl=0.3, auto_renew=True) as handle:
            assert in_thread(lambda: backend.force_release(name)) is True
            deadline = time.monotonic() + 0.3  # before the lease would have ended
            while not handle.marked_lost and time.monotonic() < deadline:
                time.sleep(0.01)
            assert handle.marked_lost, "the renewal did not notice"
            assert not THREADS.scheduled(handle)
        assert events.count(("lock_lost", name)) == 1

    def test_auto_renew_stops_at_max_hold(self, backend, unique) -> None:
        """max_hold=0.6 on a 0.3 s lease: renewed past its TTL, then it ends at the cap."""
        if not backend.supports_expiry:
            return
        name = unique()
        handle = backend.lock(name, ttl=0.3, auto_renew=True, max_hold=0.6)
        assert handle.acquire()
        time.sleep(0.45)  # past the TTL: held because renewed
        assert handle.held
        assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
        time.sleep(0.3)  # past the cap
        assert handle.lost and not THREADS.scheduled(handle)
        assert in_thread(lambda: _acquire_release(backend, name)) is True
        with pytest.raises(LockLost):
            handle.release()

    # -- async ----------------------------------------------------------------------

    def test_async_waiters_get_the_lock_when_released(self, backend, unique) -> None:
        """Tasks wait (none is granted while a thread holds), then each gets it in turn."""
        name = unique()
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with backend.lock(name):
                held.set()
                release.wait(10)

        holder = threading.Thread(target=lambda: in_thread(hold))
        holder.start()
        assert held.wait(10)

        async def main() -> list[bool]:
            async def wait() -> bool:
                async with backend.lock(name, timeout=10) as handle:
                    await asyncio.sleep(0.01)
                    return handle.held

            waiters = [asyncio.ensure_future(wait()) for _ in range(3)]
            await asyncio.sleep(0.3)
            assert not any(w.done() for w in waiters)
            release.set()
            return list(await asyncio.gather(*waiters))

        try:
            assert asyncio.run(main()) == [True, True, True]
        finally:
            release.set()
            holder.join(10)
            _close_async_connections()

    def test_async_acquire_release(self, backend, unique) -> None:
        name = unique()

        async def main() -> list[bool]:
            async with backend.lock(name) as held:
                assert held.held
                other = backend.lock(name)
                got_other = await other.aacquire(blocking=False)
            free = backend.lock(name + "/free")
            assert await free.aacquire(blocking=False)  # a free lock, not waiting
            await free.arelease()
            handle = backend.lock(name)
            got = await handle.aacquire(timeout=2)
            await handle.aextend(10)
            await handle.arelease()
            return [got_other, got]

        assert asyncio.run(main()) == [False, True]
        _close_async_connections()


def _close_async_connections() -> None:
    """Close the connections the event loop's worker thread opened (asgiref's)."""
    from asgiref.sync import async_to_sync, sync_to_async

    async_to_sync(sync_to_async(connections.close_all))()


def _acquire_release(backend: BaseLockBackend, name: str) -> bool:
    handle = backend.lock(name)
    got = handle.acquire(timeout=5)
    if got:
        handle.release()
    return got


def _token_of_one_grant(backend: BaseLockBackend, name: str) -> int | None:
    with backend.lock(name, timeout=5) as handle:
        return handle.fencing_token
