"""Suite ``scale.handoff``: the waiter processes (threads or asyncio tasks on one name).

Every waiter loops until the parent sets ``stop`` (or :data:`WAIT` past its round's
start plus the longest round, a bound): acquire, note ``monotonic_ns()``, hold by
sleeping, note ``monotonic_ns()``, release, and add one to the shared ``granted``
count (the parent starts its window once every waiter has had its turn).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from .contention import STARTUP_TIMEOUT
from .scale_handoff_requests import count_listings, count_statements

#: How long one acquire may wait: 1,000 waiters in a fair queue wait ~1,000 holds.
WAIT = 60.0
#: The longest a round may run before its waiters stop by themselves (a bound).
ROUND_LIMIT = 300.0

Grant = tuple[int, int]  # acquire-return ns, just-before-release ns


@dataclass(frozen=True)
class Shared:
    """What the parent and its waiters share: grants so far, statements sent (PostgreSQL)
    or listings (``get_children``, ZooKeeper), and the parent's stop."""

    granted: Any  # multiprocessing.Value
    statements: Any  # multiprocessing.Value
    stop: Any  # multiprocessing.Event

    def add_grant(self) -> None:
        with self.granted.get_lock():
            self.granted.value += 1

    def over(self, hard: int) -> bool:
        return self.stop.is_set() or time.monotonic_ns() > hard


def _loop(locker: Any, shared: Shared, hard: int, hold_s: float) -> tuple[list[Grant], int]:
    clock, grants, timeouts = time.monotonic_ns, [], 0
    while not shared.over(hard):
        if not locker.acquire():
            timeouts += 1
            continue
        acquired = clock()
        time.sleep(hold_s)
        releasing = clock()
        locker.release()
        grants.append((acquired, releasing))
        shared.add_grant()
    return grants, timeouts


async def _aloop(locker: Any, shared: Shared, hard: int, hold_s: float
                 ) -> tuple[list[Grant], int]:
    clock, grants, timeouts = time.monotonic_ns, [], 0
    while not shared.over(hard):
        if not await locker.aacquire():
            timeouts += 1
            continue
        acquired = clock()
        await asyncio.sleep(hold_s)
        releasing = clock()
        await locker.arelease()
        grants.append((acquired, releasing))
        shared.add_grant()
    return grants, timeouts


def worker(factory: Any, key: str, mode: str, count: int, rounds: int, hold_s: float,
           shared: Shared, barrier: Any, results: Any, counter: str = "") -> None:
    """One process: ``count`` waiters as threads or tasks, ``rounds`` rounds (``counter``:
    the case's server counter; ZooKeeper's also counts the listings sent)."""
    lockers: list[Any] = []
    try:
        count_statements(shared.statements)
        if counter.startswith("zookeeper"):
            count_listings(shared.statements)
        lockers = [factory(key) for _ in range(count)]
        if mode == "tasks":
            asyncio.run(_tasks(lockers, rounds, hold_s, shared, barrier, results))
        else:
            _threads(lockers, rounds, hold_s, shared, barrier, results)
    except BaseException:
        results.put(("error", mode, os.getpid(), traceback.format_exc()))
        barrier.abort()
    finally:
        for locker in lockers:
            locker.close()


def _threads(lockers: list[Any], rounds: int, hold_s: float, shared: Shared, barrier: Any,
             results: Any) -> None:
    go, done = threading.Barrier(len(lockers) + 1), threading.Barrier(len(lockers) + 1)
    hard = [0]
    out: list[Any] = [None] * len(lockers)

    def waiter(i: int) -> None:
        try:
            if lockers[i].acquire():  # opens this thread's connections
                lockers[i].release()
            for _ in range(rounds):
                go.wait(STARTUP_TIMEOUT + WAIT)
                out[i] = _loop(lockers[i], shared, hard[0], hold_s)
                done.wait(ROUND_LIMIT + WAIT)
        except threading.BrokenBarrierError:
            pass
        except BaseException:
            out[i] = traceback.format_exc()
            go.abort()
            done.abort()

    threads = [threading.Thread(target=waiter, args=(i,), daemon=True) for i in range(len(out))]
    for thread in threads:
        thread.start()
    try:
        for round_ in range(rounds):
            barrier.wait(STARTUP_TIMEOUT + WAIT)
            hard[0] = time.monotonic_ns() + int(ROUND_LIMIT * 1e9)
            go.wait(STARTUP_TIMEOUT)
            done.wait(ROUND_LIMIT + WAIT)
            results.put(("round", round_, list(out)))
    except threading.BrokenBarrierError:
        failed = [o for o in out if isinstance(o, str)]
        raise RuntimeError(failed[0] if failed else "a waiter thread's barrier broke") from None


async def _tasks(lockers: list[Any], rounds: int, hold_s: float, shared: Shared, barrier: Any,
                 results: Any) -> None:
    async def once(locker: Any) -> None:  # opens the pool's sessions
        if await locker.aacquire():
            await locker.arelease()

    await asyncio.gather(*(once(locker) for locker in lockers))
    loop = asyncio.get_running_loop()
    for round_ in range(rounds):
        await loop.run_in_executor(None, barrier.wait, STARTUP_TIMEOUT + WAIT)
        hard = time.monotonic_ns() + int(ROUND_LIMIT * 1e9)
        out = await asyncio.gather(*(_aloop(locker, shared, hard, hold_s) for locker in lockers))
        results.put(("round", round_, list(out)))
