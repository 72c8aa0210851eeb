"""The core of the contract: acquire, release, waiting, expiry, extend, fencing, names,
ownership, signals, loss and health. Checks are plain methods taking the backend;
``pytest_suite`` and ``unittest_suite`` make them tests."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import Any

from ...backends.base import BaseLockBackend
from ...exceptions import (
    DistLockError,
    InvalidLockName,
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    LockTimeout,
    SelfDeadlock,
)
from ...handle import hold_of
from .support import (
    BAD_NAMES,
    BAD_TYPES,
    ODD_NAMES,
    ContractBase,
    acquire_release,
    in_thread,
    io_calls,
    raises,
    token_of_one_grant,
)


class CoreChecks(ContractBase):
    """What every backend does, whatever its capabilities."""

    # -- acquire and release ------------------------------------------------

    def check_acquire_release(self, backend: BaseLockBackend) -> None:
        name = self.unique()
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
        assert in_thread(lambda: acquire_release(backend, name)) is True

    def check_non_blocking_miss_returns_false(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        with backend.lock(name):
            started = time.monotonic()
            assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
            assert time.monotonic() - started < 5

    def check_timeout_waits_then_returns_false(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        with backend.lock(name):
            started = time.monotonic()
            assert in_thread(lambda: backend.lock(name).acquire(timeout=0.4)) is False
            assert time.monotonic() - started >= 0.4

    def check_with_raises_when_not_acquired(self, backend: BaseLockBackend) -> None:
        name = self.unique()

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

    def check_waiter_gets_the_lock_when_released(self, backend: BaseLockBackend) -> None:
        name = self.unique()
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

    def check_release_not_held(self, backend: BaseLockBackend) -> None:
        handle = backend.lock(self.unique())
        with raises(LockNotHeld):
            handle.release()
        handle.acquire()
        handle.release()
        with raises(LockNotHeld):
            handle.release()

    def check_handle_holds_one_acquisition_at_a_time(self, backend: BaseLockBackend) -> None:
        handle = backend.lock(self.unique())
        handle.acquire()
        with raises(DistLockError):
            handle.acquire()
        handle.release()
        assert handle.acquire() is True
        handle.release()

    # -- expiry and extend ---------------------------------------------------

    def check_lease_expires_on_the_server(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        handle = backend.lock(name, ttl=0.3)
        handle.acquire()
        time.sleep(0.45)
        if not backend.supports_expiry:  # held until released, whatever the ttl
            assert not handle.lost
            assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
            handle.release()
            return
        assert handle.lost
        assert in_thread(lambda: acquire_release(backend, name)) is True
        with raises(LockLost):
            handle.release()

    def check_extend(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        handle = backend.lock(name, ttl=1)  # 0.5 s: lost before its extend under load
        handle.acquire()
        token = handle.fencing_token
        handle.extend(5)
        time.sleep(1.2)
        assert not handle.lost
        assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
        assert handle.fencing_token == token
        handle.release()
        with raises(LockNotHeld):
            handle.extend(5)

    def check_extend_after_expiry_is_lost(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        handle = backend.lock(name, ttl=0.2)
        handle.acquire()
        time.sleep(0.35)
        if not backend.supports_expiry:
            handle.extend(5)  # still held: extending works
            handle.release()
            return
        assert in_thread(lambda: acquire_release(backend, name)) is True
        with raises(LockLost):
            handle.extend(5)
        assert handle.lost

    def check_bad_ttl_and_timeout(self, backend: BaseLockBackend) -> None:
        for bad in (0, -1, float("nan"), float("inf"), 10**9):
            with raises(ValueError):
                backend.lock(self.unique(), ttl=bad)
        for bad_type in ("5", None, True):
            with raises(TypeError):
                backend.lock(self.unique(), ttl=bad_type)  # type: ignore[arg-type]
        with raises(ValueError):
            backend.lock(self.unique(), timeout=-1)
        handle = backend.lock(self.unique())
        with raises(ValueError):
            handle.acquire(timeout=-0.5)
        assert handle.acquire() is True  # a refused call changed nothing
        handle.release()

    # -- fencing ----------------------------------------------------------------

    def check_fencing_token_strictly_increases(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        if not backend.supports_fencing:
            assert token_of_one_grant(backend, name) is None
            return
        tokens = []
        for _ in range(4):
            tokens.append(in_thread(lambda: token_of_one_grant(backend, name)))
            tokens.append(token_of_one_grant(backend, name))
            tokens.append(token_of_one_grant(backend, name))
        # Each an int, at every grant (a grant like the one before it may take another
        # path: on MariaDB's session mode a Decimal once slipped through there).
        assert {type(token) for token in tokens} == {int}, tokens
        assert tokens == sorted(set(tokens)), tokens

    # -- names ------------------------------------------------------------------

    def check_bad_names_refused_before_any_call(self, backend: BaseLockBackend) -> None:
        for name in BAD_NAMES:
            with io_calls(backend) as calls:
                with raises(InvalidLockName):
                    backend.lock(name)
                with raises(ValueError):  # InvalidLockName is a ValueError
                    backend.force_release(name)
            assert calls == [], (name, calls)

    def check_non_string_names_refused(self, backend: BaseLockBackend) -> None:
        for name in BAD_TYPES:
            with raises(InvalidLockName):
                backend.lock(name)  # type: ignore[arg-type]

    def check_odd_names_are_distinct_locks(self, backend: BaseLockBackend) -> None:
        tag = self.unique("")
        handles = [backend.lock(tag + name) for name in ODD_NAMES]
        for handle in handles:
            assert handle.acquire(blocking=False) is True
        for handle in reversed(handles):  # transaction mode nests: innermost first
            handle.release()

    # -- ownership ---------------------------------------------------------------

    def check_owner_token_is_per_handle(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        first, second = backend.lock(name), backend.lock(self.unique("other"))
        assert first.acquire() and second.acquire()
        assert first.owner_id != second.owner_id
        acquisition = hold_of(first).acquisition
        token = acquisition.token if acquisition else ""
        assert len(token) == 32  # 128 bits
        assert token not in repr(first)
        second.release()
        first.release()

    def check_long_names_are_distinct_locks(self, backend: BaseLockBackend) -> None:
        base = self.unique("long") + "x" * 300
        first, second = backend.lock(base + "1"), backend.lock(base + "2")
        assert first.acquire(blocking=False) and second.acquire(blocking=False)
        assert in_thread(lambda: backend.lock(base + "1").acquire(blocking=False)) is False
        second.release()
        first.release()
        huge = backend.lock(self.unique("y" * 10_240))  # any length
        assert huge.acquire(blocking=False)
        huge.release()

    def check_self_deadlock_raises_at_once(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        with backend.lock(name):
            started = time.monotonic()
            with raises(SelfDeadlock):
                backend.lock(name).acquire(timeout=5)
            assert time.monotonic() - started < 2
            assert backend.lock(name).acquire(blocking=False) is False

    # -- signals, loss, health ----------------------------------------------------

    def check_signals(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        with self.events(backend) as events, backend.lock(name):
            pass
        assert events == [("lock_acquired", name), ("lock_released", name)]
        if not backend.supports_force_release:
            return
        handle = backend.lock(name)
        with self.events(backend) as events:
            handle.acquire()
            assert backend.force_release(name)
            with raises(LockLost):
                handle.release()
        assert events == [
            ("lock_acquired", name), ("lock_force_released", name), ("lock_lost", name)
        ]

    def check_mark_lost_makes_the_exit_raise(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        with self.events(backend) as events, raises(LockLost), backend.lock(name) as handle:
            hold_of(handle).mark_lost()
            hold_of(handle).mark_lost()  # once is enough
            assert handle.lost and not handle.held
        assert events.count(("lock_lost", name)) == 1
        assert in_thread(lambda: acquire_release(backend, name)) is True  # released anyway

    def check_a_lost_handle_no_longer_counts_as_held_by_its_thread(
        self, backend: BaseLockBackend
    ) -> None:
        name = self.unique()
        with raises(LockLost), backend.lock(name) as handle:
            hold_of(handle).mark_lost()  # (a session ended, a renewal failed, a force release)
            # the thread may wait for the name again: not a SelfDeadlock
            other = backend.lock(name)
            if other.acquire(timeout=0.2):
                other.release()

    def check_an_expired_lease_no_longer_counts_as_held_by_its_thread(
        self, backend: BaseLockBackend
    ) -> None:
        """A lease that ran out (on this process' clock) is not held: the thread that
        held it waits for the name again through a new handle (it raised SelfDeadlock
        until that handle's release)."""
        if not backend.supports_expiry:
            return
        name = self.unique()
        handle = backend.lock(name, ttl=0.3)
        assert handle.acquire()
        time.sleep(0.45)
        assert handle.lost
        other = backend.lock(name, ttl=30)
        assert other.acquire(timeout=5) is True
        other.release()
        with raises(LockLost):
            handle.release()

    def check_a_dropped_handle_no_longer_counts_as_held_by_its_thread(
        self, backend: BaseLockBackend
    ) -> None:
        """A handle dropped by an exception before its release is not held by the thread
        any more once its lease ended: a new handle of the thread waits for the name
        instead of raising SelfDeadlock. (Where locks do not expire, the dropped lease
        stays held, by the session or the transaction, and SelfDeadlock is right.)"""
        if not backend.supports_expiry:
            return
        name = self.unique()

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

    def check_health_and_close(self, backend: BaseLockBackend) -> None:
        assert backend.health() >= 0
        backend.close()
        assert in_thread(lambda: acquire_release(backend, self.unique())) is True
        assert acquire_release(backend, self.unique()) is True
