"""Mutual exclusion and crash recovery with real OS processes, on every database setup.

Each worker records the interval it held the lock for (``CLOCK_MONOTONIC``
is system-wide on Linux, so intervals from different processes compare);
no two intervals may overlap.
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import pytest
from django.db import connections

from django_distlock import locks

from .conftest import (
    LIBRARY_DB,
    MYSQL_ALIASES,
    PG_ALIASES,
    SQLITE_ALIASES,
    advisory_locks,
    eventually,
    require_alias,
    require_pg,
)
from .figures import record
from .histories import FORK, done, fork_ready, history, overlaps, run_forked

pytestmark = LIBRARY_DB
ALIASES = SQLITE_ALIASES + PG_ALIASES + MYSQL_ALIASES

def test_the_overlap_check_sees_unlocked_workers(unique) -> None:
    assert overlaps(history(None, unique(), workers=4, rounds=10)) != []


@pytest.mark.parametrize("alias", ALIASES)
def test_no_two_holders_overlap(alias: str, unique) -> None:
    require_alias(alias)
    found = history(alias, unique("exclusion"), workers=5, rounds=12)
    pids = {pid for _, _, pid in found}
    assert len(pids) == 5  # every process served
    assert overlaps(found) == []


def _hold_forever(alias: str, name: str, ready: Any) -> None:
    handle = locks[alias].lock(name, ttl=1.5)
    assert handle.acquire(timeout=10)
    ready.set()
    time.sleep(600)


@pytest.mark.parametrize("alias", ALIASES)
def test_sigkilled_holder_frees_the_lock(alias: str, unique) -> None:
    require_alias(alias)
    name = unique("crash")
    fork_ready()
    ready = FORK.Event()
    proc = FORK.Process(target=_hold_forever, args=(alias, name, ready))
    proc.start()
    assert ready.wait(30)
    backend = locks[alias]
    assert backend.lock(name).acquire(blocking=False) is False
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    proc.join(10)
    handle = backend.lock(name)
    if backend.supports_expiry:
        # Freed by the TTL on the server's clock, not at once.
        assert handle.acquire(blocking=False) is False
        assert handle.acquire(timeout=10) is True
    else:
        # Transaction mode: the dead connection's transaction is rolled back.
        assert handle.acquire(timeout=5) is True
    record("sigkill", alias, ttl_s=1.5, freed_s=round(time.monotonic() - killed, 2),
           bound_s=10 if backend.supports_expiry else 5)
    handle.release()


def _wait_for(alias: str, name: str) -> None:
    locks[alias].lock(name, ttl=30).acquire(timeout=60)


def test_sigkilled_waiter_is_not_handed_the_lock(unique) -> None:
    """PostgreSQL lease mode: a waiter whose process dies leaves the server's queue (its
    server process notices the lost client within a second) and its reservation is not
    handed the lock: the holder's release frees it."""
    require_pg()
    backend = locks["pg-lease"]
    holder = backend.lock(unique("waiter-crash"), ttl=30)
    assert holder.acquire()
    fork_ready()
    proc = FORK.Process(target=_wait_for, args=("pg-lease", holder.name))
    proc.start()
    cursor = backend.sessions.get().cursor

    def reserved() -> bool:
        cursor.execute("SELECT next_pid FROM django_distlock_lock WHERE name = %s", [holder.key])
        return cursor.fetchone()[0] == proc.pid

    assert eventually(reserved, timeout=30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    time.sleep(2.5)  # the server's client check runs every second
    holder.release()
    newcomer = backend.lock(holder.name, ttl=30)
    assert newcomer.acquire(blocking=False)
    assert newcomer.fencing_token == holder.fencing_token + 1
    newcomer.release()


def _hold_for(alias: str, name: str, ttl: float, ready: Any) -> None:
    locks[alias].lock(name, ttl=ttl).acquire()
    ready.set()
    time.sleep(3600)  # until killed; never released


def test_dead_head_and_dead_holder_free_the_name_at_the_holders_expiry(unique) -> None:
    """PostgreSQL lease mode: the head waiter reserves the lock and dies, then the holder
    dies too: a live waiter gets the lock when the holder's lease ends, not when the dead
    head's reservation would have (it waited the holder's TTL plus the head's)."""
    require_pg()
    backend, name = locks["pg-lease"], unique("dead-head")
    fork_ready()
    ready = FORK.Event()
    holder = FORK.Process(target=_hold_for, args=("pg-lease", name, 3.0, ready))
    holder.start()
    assert ready.wait(30)
    expires = time.monotonic() + 3.0
    head = FORK.Process(target=_wait_for, args=("pg-lease", name))  # ttl 30
    head.start()
    cursor = backend.sessions.get().cursor
    key = backend.make_key(name)

    def reserved() -> bool:
        cursor.execute("SELECT next_pid FROM django_distlock_lock WHERE name = %s", [key])
        return cursor.fetchone()[0] == head.pid

    assert eventually(reserved, timeout=30)
    for proc in (head, holder):
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    handle = backend.lock(name, ttl=30)
    assert handle.acquire(timeout=20)
    print(f"dead head and holder: free {time.monotonic() - expires:+.2f} s after the holder's TTL")
    # The server notices a dead client within a second, and a waiter looks again every
    # second: allow for both.
    assert time.monotonic() < expires + 3.0
    handle.release()


def _short_waits(alias: str, name: str, seconds: float, out: Any) -> None:
    backend = locks[alias]
    rng = random.Random(os.getpid())
    grants, end, key = 0, time.monotonic() + seconds, backend.make_key(name)
    while time.monotonic() < end:
        handle = backend.lock(name, ttl=30, timeout=rng.choice([0.002, 0.01, 0.03]))
        if handle.acquire():
            time.sleep(rng.choice([0, 0.001]))
            handle.release()
            grants += 1
    # Still connected: does this session hold the name's queue?
    out.put((grants, advisory_locks(backend, key, 0, own_session=True)))
    locks.close_all()
    connections.close_all()


def test_waits_timing_out_leave_no_head_behind(unique) -> None:
    """PostgreSQL lease mode: many waits timing out, racing the grants, never leave a
    session holding the name's queue (the server keeps a lock granted just as its wait
    times out), which would stall every other waiter and serve one process only."""
    require_pg()
    name = unique("short-waits")
    fork_ready()
    out = FORK.Queue()
    procs = [
        FORK.Process(target=_short_waits, args=("pg-lease", name, 4.0, out)) for _ in range(5)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(10)
    assert [held for _, held in results] == [0] * len(procs)
    assert all(grants > 0 for grants, _ in results)


def _mixed_worker(alias: str, name: str, start: Any, out: Any) -> None:
    """Two threads (sync ``with``) and an event loop of four tasks (``async with``, three
    waits and three tries each) take ``name`` in one process. Puts the holds (began_ns,
    ended_ns, pid, who) and how many tries the shared connection refused."""
    import asyncio
    import threading

    from django_distlock.exceptions import ConnectionInUse, LockNotAcquired

    holds: list[tuple[int, int, int, str]] = []
    refused = [0]

    def hold(who: str) -> None:
        began = time.monotonic_ns()
        time.sleep(0.002)
        holds.append((began, time.monotonic_ns(), os.getpid(), who))

    def thread(index: int) -> None:
        for _ in range(5):
            with locks[alias].lock(name, timeout=60):
                hold(f"thread{index}")
        connections.close_all()

    async def task(index: int) -> None:
        for _ in range(3):
            async with locks[alias].lock(name, timeout=60):
                began = time.monotonic_ns()
                await asyncio.sleep(0.002)
                holds.append((began, time.monotonic_ns(), os.getpid(), f"task{index}"))
            # Without waiting, a task is refused while another task of the loop holds.
            try:
                async with locks[alias].lock(name, blocking=False):
                    began = time.monotonic_ns()
                    await asyncio.sleep(0.002)
                    holds.append((began, time.monotonic_ns(), os.getpid(), f"task{index}"))
            except ConnectionInUse:
                refused[0] += 1
            except LockNotAcquired:
                pass

    async def refused_while_another_task_holds() -> None:
        """Once for sure: a task's try while another task of the loop holds is refused."""
        held, finished = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            async with locks[alias].lock(name, timeout=60):
                held.set()
                await finished.wait()

        holding = asyncio.ensure_future(holder())
        await held.wait()
        try:
            async with locks[alias].lock(name, blocking=False):
                pass
        except ConnectionInUse:
            refused[0] += 1
        finally:
            finished.set()
            await holding

    async def tasks() -> None:
        await refused_while_another_task_holds()
        await asyncio.gather(*(task(i) for i in range(4)))

    start.wait()
    threads = [threading.Thread(target=thread, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    asyncio.run(tasks())
    for t in threads:
        t.join(60)
    out.put((holds, refused[0]))
    done()


@pytest.mark.parametrize("alias", ["pg-tx", "sqlite-tx", "mysql-tx"])
def test_transaction_mode_tasks_threads_and_processes_never_overlap(alias: str,
                                                                   unique) -> None:
    """Transaction mode, one name, taken by OS processes each running threads and asyncio
    tasks of one event loop: no two holds overlap (tasks of one loop used to hold it
    together, their UPDATEs in one shared transaction: thousands of overlaps, all
    task/task inside one process), and every task, thread and process was served."""
    require_alias(alias)
    results, exitcodes = run_forked(_mixed_worker, (alias, unique("mixed")), 3)
    assert exitcodes == [0, 0, 0]
    found = sorted(h for holds, _ in results for h in holds)
    refused = sum(count for _, count in results)
    print(f"{alias}: {len(found)} holds, {refused} task attempts refused (ConnectionInUse)")
    assert sum(1 for hold in found if hold[3].startswith("thread")) == 3 * 2 * 5
    assert len(found) >= 3 * (2 * 5 + 4 * 3)  # every wait was served, tries some times
    assert overlaps(found) == []
    assert refused >= 3  # each process' task was refused while another task held
