"""The contract's checks of ``auto_renew`` (the watchdog that renews a lease while it
is held) and of the async API (``aacquire``, ``async with``)."""

from __future__ import annotations

import asyncio
import threading
import time

from ...backends.base import BaseLockBackend
from ...exceptions import LockLost, UnsupportedOperation
from ...handle import hold_of
from ...renewal import THREADS, loop_schedule
from .support import ContractBase, acquire_release, close_async_connections, in_thread, raises

#: The auto-renewed lease of the renewal checks: renewed every third, so a renewal may
#: be late by two thirds (a stalled CI machine) before the lease ends.
SHORT_TTL = 1.0


class RenewalChecks(ContractBase):
    """``auto_renew`` where locks expire, and the async API."""

    def check_auto_renew_options(self, backend: BaseLockBackend) -> None:
        with raises(TypeError):
            backend.lock(self.unique(), auto_renew="yes")  # type: ignore[arg-type]
        with raises(ValueError):
            backend.lock(self.unique(), max_hold=5)  # without auto_renew
        if not backend.supports_expiry:
            with raises(UnsupportedOperation):
                backend.lock(self.unique(), auto_renew=True)
            return
        for bad in (0, -1, float("nan")):
            with raises(ValueError):
                backend.lock(self.unique(), auto_renew=True, max_hold=bad)
        with raises(TypeError):
            backend.lock(self.unique(), auto_renew=True, max_hold="5")  # type: ignore[arg-type]

    def check_auto_renew_keeps_a_short_lease(self, backend: BaseLockBackend) -> None:
        """A 1 s lease held for 1.3 s: renewed every third of it, nobody else gets it; the
        release stops the renewals (the lock stays free, and no loss is reported). The
        lease leaves a renewal 0.6 s of slack, for a loaded CI machine's stalls."""
        if not backend.supports_expiry:
            return
        name = self.unique()
        with self.events(backend) as events:
            handle = backend.lock(name, ttl=SHORT_TTL, auto_renew=True)
            assert handle.acquire()
            assert THREADS.scheduled(hold_of(handle))
            for _ in range(2):
                time.sleep(0.65)
                assert handle.held and not handle.lost
                assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
            handle.release()
            assert not THREADS.scheduled(hold_of(handle))
            assert in_thread(lambda: backend.lock(name).locked()) is False
            time.sleep(0.4)  # past a renewal period: a late renewal would show
            assert in_thread(lambda: acquire_release(backend, name)) is True
        assert events.count(("lock_lost", name)) == 0

    def check_auto_renew_async(self, backend: BaseLockBackend) -> None:
        """The same for ``async with``: the event loop's renewal task keeps the lease."""
        if not backend.supports_expiry:
            return
        name = self.unique()
        with self.events(backend) as events:

            async def main() -> list[bool]:
                seen = []
                async with backend.lock(name, ttl=SHORT_TTL, auto_renew=True) as handle:
                    schedule = loop_schedule()
                    hold = hold_of(handle)
                    assert schedule.scheduled(hold) and not THREADS.scheduled(hold)
                    for _ in range(2):
                        await asyncio.sleep(0.65)
                        other = backend.lock(name)
                        seen.append(handle.held and not await other.aacquire(blocking=False))
                seen.append(not schedule.scheduled(hold_of(handle)))
                await asyncio.sleep(0.4)
                free = backend.lock(name)
                seen.append(await free.aacquire(blocking=False))
                await free.arelease()
                return seen

            try:
                assert asyncio.run(main()) == [True] * 4
            finally:
                close_async_connections()
        assert events.count(("lock_lost", name)) == 0

    def check_auto_renew_reports_a_force_release(self, backend: BaseLockBackend) -> None:
        """A renewal that finds the lock taken away marks the handle lost at once, stops,
        and the ``with`` exit raises LockLost; lock_lost is sent once."""
        if not backend.supports_expiry or not backend.supports_force_release:
            return
        name = self.unique()
        with (
            self.events(backend) as events,
            raises(LockLost),
            backend.lock(name, ttl=SHORT_TTL, auto_renew=True) as handle,
        ):
            assert in_thread(lambda: backend.force_release(name)) is True
            deadline = time.monotonic() + SHORT_TTL  # before the lease would have ended
            while not hold_of(handle).marked_lost and time.monotonic() < deadline:
                time.sleep(0.01)
            assert hold_of(handle).marked_lost, "the renewal did not notice"
            assert not THREADS.scheduled(hold_of(handle))
        assert events.count(("lock_lost", name)) == 1

    def check_auto_renew_stops_at_max_hold(self, backend: BaseLockBackend) -> None:
        """max_hold=1.2 on a 0.6 s lease: renewed past its TTL, then it ends at the cap."""
        if not backend.supports_expiry:
            return
        name = self.unique()
        handle = backend.lock(name, ttl=0.6, auto_renew=True, max_hold=1.2)
        assert handle.acquire()
        time.sleep(0.8)  # past the TTL: held because renewed
        assert handle.held
        assert in_thread(lambda: backend.lock(name).acquire(blocking=False)) is False
        time.sleep(0.6)  # past the cap
        assert handle.lost and not THREADS.scheduled(hold_of(handle))
        assert in_thread(lambda: acquire_release(backend, name)) is True
        with raises(LockLost):
            handle.release()

    # -- async ----------------------------------------------------------------------

    def check_async_waiters_get_the_lock_when_released(self, backend: BaseLockBackend) -> None:
        """Tasks wait (none is granted while a thread holds), then each gets it in turn."""
        name = self.unique()
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
            close_async_connections()

    def check_async_acquire_release(self, backend: BaseLockBackend) -> None:
        name = self.unique()

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
        close_async_connections()
