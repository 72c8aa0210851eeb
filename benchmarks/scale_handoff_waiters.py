"""Suite ``scale.handoff``: the waiter processes (threads or asyncio tasks on one name)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import traceback
from typing import Any

from .contention import STARTUP_TIMEOUT
from .scale_handoff_requests import _STATEMENTS, count_statements

#: How long one acquire may wait: 1,000 waiters in a fair queue wait ~1,000 holds.
WAIT = 60.0

Grant = tuple[int, int]  # acquire-return ns, just-before-release ns


def _loop(locker: Any, deadline: int, hold_s: float) -> tuple[list[Grant], int]:
    clock, grants, timeouts = time.monotonic_ns, [], 0
    while clock() < deadline:
        if not locker.acquire():
            timeouts += 1
            continue
        acquired = clock()
        time.sleep(hold_s)
        releasing = clock()
        locker.release()
        grants.append((acquired, releasing))
    return grants, timeouts


async def _aloop(locker: Any, deadline: int, hold_s: float) -> tuple[list[Grant], int]:
    clock, grants, timeouts = time.monotonic_ns, [], 0
    while clock() < deadline:
        if not await locker.aacquire():
            timeouts += 1
            continue
        acquired = clock()
        await asyncio.sleep(hold_s)
        releasing = clock()
        await locker.arelease()
        grants.append((acquired, releasing))
    return grants, timeouts


def _snap_statements(window: tuple[float, float], into: list[int]) -> None:
    """At the window's two ends (seconds from now), note the statements sent so far."""
    for at in window:
        threading.Timer(at, lambda: into.append(_STATEMENTS[0])).start()


def _worker(factory: Any, key: str, mode: str, count: int, rounds: int, duration: float,
            window: tuple[float, float], hold_s: float, barrier: Any, results: Any) -> None:
    """One process: ``count`` waiters as threads or tasks, ``rounds`` rounds."""
    lockers_: list[Any] = []
    try:
        count_statements()
        lockers_ = [factory(key) for _ in range(count)]
        if mode == "tasks":
            asyncio.run(_tasks(lockers_, rounds, duration, window, hold_s, barrier, results))
        else:
            _threads(lockers_, rounds, duration, window, hold_s, barrier, results)
    except BaseException:
        results.put(("error", mode, os.getpid(), traceback.format_exc()))
        barrier.abort()
    finally:
        for locker in lockers_:
            locker.close()


def _threads(lockers_: list[Any], rounds: int, duration: float, window: tuple[float, float],
             hold_s: float, barrier: Any, results: Any) -> None:
    go, done = threading.Barrier(len(lockers_) + 1), threading.Barrier(len(lockers_) + 1)
    deadline = [0]
    out: list[Any] = [None] * len(lockers_)

    def waiter(i: int) -> None:
        try:
            if lockers_[i].acquire():  # opens this thread's connections
                lockers_[i].release()
            for _ in range(rounds):
                go.wait(STARTUP_TIMEOUT + WAIT)
                out[i] = _loop(lockers_[i], deadline[0], hold_s)
                done.wait(duration + WAIT + STARTUP_TIMEOUT)
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
            start = time.monotonic_ns()
            deadline[0] = start + int(duration * 1e9)
            snaps: list[int] = []
            _snap_statements(window, snaps)
            go.wait(STARTUP_TIMEOUT)
            done.wait(duration + WAIT + STARTUP_TIMEOUT)
            results.put(("round", round_, start, list(out), snaps))
    except threading.BrokenBarrierError:
        failed = [o for o in out if isinstance(o, str)]
        raise RuntimeError(failed[0] if failed else "a waiter thread's barrier broke") from None


async def _tasks(lockers_: list[Any], rounds: int, duration: float, window: tuple[float, float],
                 hold_s: float, barrier: Any, results: Any) -> None:
    async def once(locker: Any) -> None:  # opens the pool's sessions
        if await locker.aacquire():
            await locker.arelease()

    await asyncio.gather(*(once(locker) for locker in lockers_))
    loop = asyncio.get_running_loop()
    for round_ in range(rounds):
        await loop.run_in_executor(None, barrier.wait, STARTUP_TIMEOUT + WAIT)
        start = time.monotonic_ns()
        deadline = start + int(duration * 1e9)
        snaps: list[int] = []
        _snap_statements(window, snaps)
        out = await asyncio.gather(*(_aloop(locker, deadline, hold_s) for locker in lockers_))
        results.put(("round", round_, start, list(out), snaps))


