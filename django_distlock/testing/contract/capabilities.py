"""The contract's capability checks: listing, force release, and every ``supports_*``
flag against behaviour both ways (a backend that says yes does it; one that says no
refuses with UnsupportedOperation before any call that reaches its server)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from ...backends.base import BaseLockBackend, HeldCount
from ...context import holder_context
from ...exceptions import InvalidLockName, LockLost, UnsupportedOperation
from ...handler import locks
from ...leadership import Leadership
from .support import (
    FLAGS,
    ContractBase,
    acquire_release,
    in_thread,
    io_calls,
    raises,
)


class CapabilityChecks(ContractBase):
    """Listing, force release, and the capability flags."""

    def check_held_locks_pages(self, backend: BaseLockBackend) -> None:
        base = self.unique("list")
        names = [f"{base}/{i}" for i in range(3)]
        if not backend.supports_listing:
            with raises(UnsupportedOperation):
                backend.held_locks(prefix=base)
            return
        handles = [backend.lock(n) for n in names]
        for handle in handles:
            handle.acquire()
        other = backend.lock(self.unique("elsewhere"))
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
                assert info.pid is not None and info.expires_at and info.acquired_at
                assert info.expires_at > info.acquired_at
        finally:
            for handle in reversed([*handles, other]):
                handle.release()
        assert list(backend.held_locks(prefix=base + "/")) == []

    def check_listing_shows_what_the_holder_is_doing(self, backend: BaseLockBackend) -> None:
        """The context ``@distlock`` or ``holder_context()`` sets is stored with the holder
        and listed apart from the thread; hostile text (control characters, the
        separator, 5,000 characters from a URL) is cleaned and cut, never breaking it."""
        if not backend.supports_listing:
            return
        base = self.unique("ctx")
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
        assert {info.thread for info in infos} == {plain.holder.thread}
        context = infos[2].context
        assert context.startswith("GET /x???/éé") and context.endswith("…")
        thread, hostile_context = plain.holder.thread, hostile.holder.context
        assert len(thread) + 1 + len(context) <= 255
        assert context == hostile_context[: len(context) - 1] + "…"

    def check_count_held(self, backend: BaseLockBackend) -> None:
        """``supports_counting``: the locks held under a prefix, exact up to the cap and
        "at least the cap" past it; bad arguments refused before any call."""
        if not backend.supports_counting:
            return
        base = self.unique("count") + "/"
        handles = [backend.lock(f"{base}{i}") for i in range(3)]
        for handle in handles:
            handle.acquire()
        try:
            assert backend.count_held(prefix=base) == HeldCount(3, True)
            capped = backend.count_held(prefix=base, limit=2)
            assert (capped.count, capped.exact) == (2, False)
            handles[0].release()
            assert backend.count_held(prefix=base) == HeldCount(2, True)
            assert backend.count_held(prefix=base + "0") == HeldCount(0, True)
        finally:
            for handle in handles[1:]:
                handle.release()
        assert backend.count_held(prefix=base) == HeldCount(0, True)
        for bad in (0, 1_000_001, True):
            with io_calls(backend) as calls, raises((TypeError, ValueError)):
                backend.count_held(limit=bad)
            assert calls == []

    def check_held_locks_validates_arguments(self, backend: BaseLockBackend) -> None:
        with raises(ValueError):
            backend.held_locks(limit=0)
        with raises(TypeError):
            backend.held_locks(limit="10")  # type: ignore[arg-type]
        with raises(TypeError):
            backend.held_locks(prefix=None)  # type: ignore[arg-type]
        with raises(InvalidLockName):
            backend.held_locks(prefix="a\x00")

    def check_force_release(self, backend: BaseLockBackend) -> None:
        name = self.unique()
        handle = backend.lock(name)
        handle.acquire()
        if not backend.supports_force_release:
            with raises(UnsupportedOperation):
                backend.force_release(name)
            handle.release()
            return
        assert in_thread(lambda: backend.force_release(name)) is True
        assert in_thread(lambda: backend.force_release(name)) is False
        assert in_thread(lambda: acquire_release(backend, name)) is True
        with raises(LockLost):
            handle.release()

    def check_force_release_of_the_holder_shown(self, backend: BaseLockBackend) -> None:
        """With ``owner``, only that holder's lock is freed (checked on the server): a
        lock taken by someone else since it was listed stays. Where the server keeps no
        owner (``supports_force_release_by_owner`` False), ``owner`` is refused before
        any I/O and the lock stays."""
        name = self.unique()
        for bad in ("", "0123456", "0123456789", "ABCDEF01", "zzzzzzzz"):
            with raises(ValueError):
                backend.force_release(name, owner=bad)
        with raises(TypeError):
            backend.force_release(name, owner=12345678)  # type: ignore[arg-type]
        if not backend.supports_force_release:
            return
        first = backend.lock(name)
        first.acquire()
        shown = first.owner_id
        if not backend.supports_force_release_by_owner:
            try:  # refused before any I/O, and the lock is left with its holder
                with io_calls(backend) as calls, raises(UnsupportedOperation):
                    backend.force_release(name, owner=shown)
                assert calls == []
                assert first.held and backend.is_locked(name)
            finally:
                first.release()
            return
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

    def check_capability_flags_are_declared(self, backend: BaseLockBackend) -> None:
        for flag in FLAGS:
            assert isinstance(getattr(type(backend), flag), bool), flag

    def check_bad_cursor_refused_before_any_call(self, backend: BaseLockBackend) -> None:
        if not backend.supports_listing:
            return
        for cursor in ("a\x00", "\ud800"):
            with io_calls(backend) as calls, raises(ValueError):
                backend.held_locks(cursor=cursor)
            assert calls == []

    def check_a_capability_it_lacks_is_refused_before_any_io(
        self, backend: BaseLockBackend
    ) -> None:
        """Each flag that is False: asking for the feature raises UnsupportedOperation,
        and none of the backend's methods that reach its server ran before."""
        name = self.unique()
        asks: list[tuple[str, Callable[[], Any]]] = [
            ("supports_listing", lambda: backend.held_locks(prefix=name)),
            ("supports_counting", lambda: backend.count_held(prefix=name)),
            ("supports_force_release", lambda: backend.force_release(name)),
            ("supports_force_release_by_owner",
             lambda: backend.force_release(name, owner="0123abcd")),
            ("supports_shared_owner",
             lambda: backend.lock(name, reentrant=True, owner="o").acquire(timeout=1)),
            ("supports_read_write", lambda: backend.read_lock(name).acquire(timeout=1)),
            ("supports_read_write", lambda: backend.write_lock(name).acquire(timeout=1)),
            ("supports_semaphore", lambda: backend.semaphore(name, 2).acquire(timeout=1)),
            ("supports_expiry", lambda: backend.lock(name, auto_renew=True).acquire(timeout=1)),
            ("supports_waiters", lambda: backend.waiters(name)),
            ("supports_age_order", lambda: backend.held_locks_by_age("acquired", prefix=name)),
            ("supports_leadership", lambda: Leadership(backend, name).__enter__()),
        ]
        for flag, ask in asks:
            if getattr(backend, flag):
                continue
            with io_calls(backend) as calls, raises(UnsupportedOperation):
                ask()
            assert calls == [], f"{flag} is False, yet {calls} ran before the refusal"

    def check_waiters_are_listed_in_arrival_order(self, backend: BaseLockBackend) -> None:
        """``supports_waiters``: two threads that wait in turn are listed in that order,
        each gone once it has the lock (a "no" is checked with the other refusals)."""
        if not backend.supports_waiters:
            return
        name = self.unique("waiters")
        holder = backend.lock(name, timeout=5)
        assert holder.acquire()
        got: list[str | None] = []
        threads = []
        try:
            assert backend.waiters(name) == []
            for count in (1, 2):
                thread = threading.Thread(target=in_thread, args=(
                    lambda: got.append(_take_and_release(backend, name)),))
                thread.start()
                threads.append(thread)
                deadline = time.monotonic() + 10
                while len(backend.waiters(name)) < count and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert len(backend.waiters(name)) == count, f"waiter {count} is not listed"
            listed = backend.waiters(name)
            assert [w.position for w in listed] == [1, 2], listed
            first, second = listed
            assert first.since is None or second.since is None or first.since <= second.since
        finally:
            holder.release()
            for thread in threads:
                thread.join(60)
        assert len(got) == 2 and all(got), got
        if first.owner and second.owner:  # served in the order listed (fair backends)
            assert set(got) == {first.owner, second.owner}
        assert backend.waiters(name) == []

    def check_distributed_locks_exclude_another_process(self, backend: BaseLockBackend) -> None:
        """``distributed``: a lock a forked child process holds is not granted here
        (nothing to check where it is False: such locks may or may not be seen)."""
        if not backend.distributed or not hasattr(os, "fork"):
            return
        name = self.unique()
        fork = multiprocessing.get_context("fork")
        out, go = fork.Queue(), fork.Event()
        # Nothing the child could share with this process (test_fork's fork_ready()).
        connections.close_all()
        locks.close_all()
        backend.close()
        child = fork.Process(target=_hold_in_child, args=(backend.alias, name, out, go))
        child.start()
        try:
            assert out.get(timeout=30) == "held"
            assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
        finally:
            go.set()
            child.join(30)
            if child.is_alive():
                child.kill()
        try:
            assert child.exitcode == 0
            assert in_thread(lambda: acquire_release(backend, name)) is True
        finally:
            # The checks above ran in threads that have ended, on a backend that
            # locks.close_all() no longer lists: their sessions would stay open until a
            # next one is opened on it (a thread's session is closed then), past the
            # test database's teardown ("being accessed by other users").
            backend.close()


def _take_and_release(backend: BaseLockBackend, name: str) -> str | None:
    """Wait for ``name``, then free it; return the owner id it was held under."""
    handle = backend.lock(name, timeout=30)
    if not handle.acquire():
        return None
    owner = handle.owner_id
    handle.release()
    return owner


def _hold_in_child(alias: str, name: str, out: Any, go: Any) -> None:
    """The forked child: hold ``name`` until the parent says go (with the child's own
    backend: the registry forgets the parent's at the fork)."""
    try:
        with locks[alias].lock(name, ttl=60, timeout=10):
            out.put("held")
            go.wait(30)
    except BaseException as exc:  # the parent reports it
        out.put(f"{type(exc).__name__}: {exc}")
    finally:
        locks.close_all()
        connections.close_all()
