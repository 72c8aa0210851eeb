"""The contract's checks of the kinds of lock a backend may offer (read-write,
semaphore, a shared owner, where its flags say so), and of reentrant handles and
``multi_lock`` (every backend)."""

from __future__ import annotations

import asyncio
import time
from functools import partial

from ...backends.base import BaseLockBackend
from ...exceptions import LockNotHeld, SelfDeadlock
from ...handle import Lock
from .support import (
    ContractBase,
    acquire_release,
    close_async_connections,
    held_elsewhere,
    in_thread,
    raises,
)


class KindChecks(ContractBase):
    """Reentrant locks, read-write locks, semaphores, multi-locks."""

    def check_reentrant_acquisitions_nest(self, backend: BaseLockBackend) -> None:
        """Curator's ``testReentrant``, on every backend: the thread holding a name
        through a reentrant handle acquires it again at once (three acquisitions in all,
        one grant); another thread waits; the lock is free after the third release."""
        name = self.unique()
        handle = backend.lock(name, reentrant=True, ttl=30)
        assert handle.acquire(blocking=False)
        token = handle.fencing_token
        assert handle.acquire(blocking=False) and handle.acquire(timeout=1)
        assert handle.fencing_token == token  # counted: not granted again
        handle.release()
        handle.release()
        assert handle.held
        assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
        handle.release()
        assert not handle.held
        assert in_thread(lambda: acquire_release(backend, name)) is True
        with raises(LockNotHeld):
            handle.release()

    def check_reentrant_handles_of_one_thread_share_the_hold(
        self, backend: BaseLockBackend
    ) -> None:
        """A locked function calling another that locks the same name: a second
        reentrant handle, in the thread that holds the name, enters at once with the
        same grant; the name is held until both are released, in either order. A
        handle that is not reentrant still raises SelfDeadlock, and another thread's
        reentrant handle waits."""
        name = self.unique()
        outer = backend.lock(name, reentrant=True, ttl=30)
        assert outer.acquire(timeout=1)
        inner = backend.lock(name, reentrant=True, ttl=30, timeout=1)
        assert inner.acquire()
        assert inner.held and outer.held and inner.fencing_token == outer.fencing_token
        with raises(SelfDeadlock):
            backend.lock(name, timeout=1).acquire()
        outer.release()  # the outer first: the inner keeps the name
        assert not outer.held and inner.held
        other = backend.lock(name, reentrant=True)
        assert in_thread(lambda: other.acquire(blocking=False)) is False
        with raises(LockNotHeld):
            outer.release()
        inner.release()
        assert not inner.held
        assert in_thread(lambda: acquire_release(backend, name)) is True

    def check_reentrant_tasks_nest_and_tasks_do_not_share(
        self, backend: BaseLockBackend
    ) -> None:
        """The same for asyncio tasks: a task's nested ``async with`` of the name enters
        at once; another task of the loop does not share the hold, it waits."""
        name = self.unique()

        async def main() -> list[bool]:
            async with backend.lock(name, reentrant=True) as outer:
                async with backend.lock(name, reentrant=True, timeout=1) as inner:
                    same = inner.fencing_token == outer.fencing_token
                    other = backend.lock(name, reentrant=True, timeout=0.2)
                    other_got = await asyncio.ensure_future(other.aacquire())
                still = outer.held and not inner.held
            return [same, other_got, still]

        try:
            assert asyncio.run(main()) == [True, False, True]
        finally:
            close_async_connections()
        assert in_thread(lambda: acquire_release(backend, name)) is True

    def check_reentrant_owner_is_shared_by_handles(self, backend: BaseLockBackend) -> None:
        """``supports_shared_owner``: handles given the same ``owner`` share the lock, in
        any thread; another owner waits."""
        if not backend.supports_shared_owner:
            return  # the refusal: check_a_capability_it_lacks_is_refused_before_any_io
        name, owner = self.unique(), self.unique("owner")
        first = backend.lock(name, reentrant=True, owner=owner)
        assert first.acquire()
        second = backend.lock(name, reentrant=True, owner=owner, timeout=1)
        assert in_thread(second.acquire) is True
        stranger = backend.lock(name, reentrant=True, owner=self.unique("stranger"))
        assert in_thread(lambda: stranger.acquire(blocking=False)) is False
        in_thread(second.release)
        assert backend.is_locked(name)
        first.release()
        assert not backend.is_locked(name)

    def check_readers_share_and_writers_exclude(self, backend: BaseLockBackend) -> None:
        """``supports_read_write``: read locks overlap read locks and keep writers out; a
        write lock keeps readers and writers out."""
        if not backend.supports_read_write:
            return
        name = self.unique()
        reader = backend.read_lock(name)
        assert reader.acquire(blocking=False)
        with held_elsewhere(lambda: backend.read_lock(name)) as second_reader:
            assert second_reader, "a read lock kept another reader out"
            assert in_thread(lambda: backend.write_lock(name).acquire(blocking=False)) is False
        assert in_thread(lambda: backend.write_lock(name).acquire(blocking=False)) is False
        reader.release()
        writer = backend.write_lock(name)
        assert writer.acquire(blocking=False), "no reader holds it: the writer gets it"
        assert in_thread(lambda: backend.read_lock(name).acquire(blocking=False)) is False
        assert in_thread(lambda: backend.write_lock(name).acquire(blocking=False)) is False
        writer.release()
        assert in_thread(lambda: _take(backend.read_lock(name))) is True

    def check_a_waiting_reader_gets_the_lock_when_the_writer_releases(
        self, backend: BaseLockBackend
    ) -> None:
        if not backend.supports_read_write:
            return
        name = self.unique()
        with held_elsewhere(lambda: backend.write_lock(name)) as writing:
            assert writing
            started = time.monotonic()
            assert in_thread(lambda: _take(backend.read_lock(name), timeout=0.3)) is False
            assert time.monotonic() - started >= 0.3
        assert in_thread(lambda: _take(backend.read_lock(name), timeout=5)) is True

    def check_the_write_holder_reading_its_name(self, backend: BaseLockBackend) -> None:
        """``supports_downgrade``: the write holder's ``read_lock`` of the name is granted
        at once and keeps others' writers out after the write's release; where False, it
        raises ``SelfDeadlock`` at once (it could only wait for itself until the timeout)."""
        if not backend.supports_read_write:
            return
        name = self.unique()
        writer = backend.write_lock(name, ttl=30)
        assert writer.acquire(blocking=False)
        reader = backend.read_lock(name, ttl=30, timeout=2)
        started = time.monotonic()
        if not backend.supports_downgrade:
            with raises(SelfDeadlock):
                reader.acquire()
            assert time.monotonic() - started < 1, "the refusal waited"
            writer.release()
            assert reader.acquire(blocking=False), "refused after the write's release"
            reader.release()
            return
        assert reader.acquire(), "the write holder waited for its own read side"
        assert time.monotonic() - started < 1, "the downgrade waited"
        writer.release()
        assert reader.held
        assert in_thread(lambda: backend.write_lock(name).acquire(blocking=False)) is False
        assert in_thread(lambda: _take(backend.read_lock(name))) is True
        reader.release()
        assert in_thread(lambda: _take(backend.write_lock(name))) is True

    def check_a_semaphore_admits_at_most_its_limit(self, backend: BaseLockBackend) -> None:
        """``supports_semaphore``: ``limit`` holders at once; the next one waits (and times
        out) or, not blocking, is refused; a release lets it in."""
        if not backend.supports_semaphore:
            return
        name = self.unique()
        first = backend.semaphore(name, 2)
        assert first.acquire(blocking=False)
        with held_elsewhere(lambda: backend.semaphore(name, 2)) as second:
            assert second, "the second of a limit of 2 was refused"
            assert in_thread(lambda: _take(backend.semaphore(name, 2))) is False
            started = time.monotonic()
            assert in_thread(lambda: _take(backend.semaphore(name, 2), timeout=0.3)) is False
            assert time.monotonic() - started >= 0.3
        assert in_thread(lambda: _take(backend.semaphore(name, 2), timeout=5)) is True
        first.release()
        assert not backend.is_locked(name)

    def check_multi_lock_takes_all_or_none(self, backend: BaseLockBackend) -> None:
        """``multi_lock``: with one name held elsewhere, it takes none (what it took first
        is given back); with all free, it holds all until released."""
        base = self.unique("multi")
        names = [f"{base}/a", f"{base}/b"]
        multi = backend.multi_lock(names)
        with held_elsewhere(lambda: backend.lock(names[1])) as other:
            assert other
            assert multi.acquire(blocking=False) is False
            assert not multi.held
        assert in_thread(lambda: _take(backend.lock(names[0]))) is True, "a was kept"
        assert multi.acquire(timeout=5) is True
        assert [in_thread(partial(_is_free, backend, n)) for n in names] == [False, False]
        multi.release()
        assert [in_thread(partial(_is_free, backend, n)) for n in names] == [True, True]


def _take(handle: Lock, timeout: float | None = None) -> bool:
    """Acquire ``handle`` (not waiting unless ``timeout``) and release it; return whether
    it was granted."""
    got = handle.acquire(blocking=False) if timeout is None else handle.acquire(timeout=timeout)
    if got:
        handle.release()
    return got


def _is_free(backend: BaseLockBackend, name: str) -> bool:
    """Whether ``name`` is granted at once (then released)."""
    return _take(backend.lock(name))
