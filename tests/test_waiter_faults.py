"""A queued waiter killed (SIGKILL) or paused (SIGSTOP) never keeps the waiters behind
it from the lock for long (issue 22's catalogue), on every backend with waiters.

Two forked processes wait, in that order, for a name this process holds; the first is
killed or paused; the holder releases: the second is granted within a bound of the
release that each backend states (a dead or silent head is skipped after its
heartbeat, its session's end, or its client check). A paused head that was handed the
lock before it froze holds it as a holder does: until its own lease ends (PostgreSQL
lease mode's reservation, see docs/database.md), so its lease here is short.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from django_distlock import locks

from .conftest import LIBRARY_DB
from .figures import record
from .histories import FORK, fork_ready
from .test_hostile import require

pytestmark = LIBRARY_DB

#: The first waiter's lease: how long a paused head that was handed the lock keeps it.
HEAD_TTL = 3.0
#: Seconds after the holder's release by which the second waiter must be granted, per
#: alias: the backend's way of skipping a dead or silent head, plus scheduling slack.
BOUND = {
    "pg-lease": HEAD_TTL + 4.0,  # the client check (1 s) / the head's reservation
    # A killed head's wait ends when the server sees its client gone (a second or two);
    # a paused one is granted, and keeps the name for its lease.
    "mysql-lease": HEAD_TTL + 4.0,
    "pg-tx": 4.0,  # a killed client's transaction ends with its socket; paused: see below
    "sqlite-lease": 4.0,  # waiters poll: no queue to be stuck in
    "redis": 6.0,  # a head silent for 2.5 s is skipped
    "redis-cluster": 6.0,
    "zk": 9.0,  # the dead or frozen head's session ends after SESSION_TIMEOUT (4 s)
    "cache-memcached": 4.0,  # waiters poll
}
#: Where a paused (not killed) head is not skipped, and why.
NO_PAUSE = {
    "pg-tx": "a frozen client's open transaction keeps its row lock until the server "
    "drops the connection (TCP keepalive): transaction mode has no lease (docs/database.md)",
}


def _hold(alias: str, name: str, pipe: Any) -> None:
    handle = locks[alias].lock(name, ttl=30)
    handle.acquire()
    pipe.send(("held", None))
    pipe.recv()  # the test says when
    handle.release()
    pipe.send(("released", time.monotonic()))
    time.sleep(30)  # keep a transaction-mode connection's end out of the picture


def _wait(alias: str, name: str, ttl: float, pipe: Any) -> None:
    handle = locks[alias].lock(name, ttl=ttl, timeout=60)
    pipe.send(("waiting", os.getpid()))
    got = handle.acquire()
    pipe.send(("granted" if got else "timeout", time.monotonic()))
    if got:
        handle.release()


def _start_waiter(alias: str, name: str, ttl: float) -> tuple[Any, Any]:
    here, there = FORK.Pipe()
    proc = FORK.Process(target=_wait, args=(alias, name, ttl, there))
    proc.start()
    assert here.poll(30) and here.recv()[0] == "waiting"
    time.sleep(0.5)  # it has sent its first attempt and queued (or started polling)
    return proc, here


CASES = [
    (alias, fault) for alias in sorted(BOUND) for fault in ("killed", "paused")
    if not (fault == "paused" and alias in NO_PAUSE)
]


@pytest.mark.parametrize(("alias", "fault"), CASES)
def test_a_queued_waiter_killed_or_paused_does_not_hold_up_the_next(
    alias: str, fault: str, unique
) -> None:
    require(alias)
    name = unique(f"waiter-{fault}")
    fork_ready()  # every process of the test is a child of a parent holding nothing
    holder_pipe, there = FORK.Pipe()
    holder = FORK.Process(target=_hold, args=(alias, name, there))
    holder.start()
    assert holder_pipe.poll(30) and holder_pipe.recv()[0] == "held"
    first, _ = _start_waiter(alias, name, HEAD_TTL)
    second, second_pipe = _start_waiter(alias, name, 30)
    try:
        os.kill(first.pid, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        time.sleep(0.3)
        holder_pipe.send("release")
        assert holder_pipe.poll(30)
        _, released = holder_pipe.recv()
        assert second_pipe.poll(BOUND[alias] + 5), f"the second waiter still waits ({fault})"
        outcome, at = second_pipe.recv()
        assert outcome == "granted"
        waited = at - released
        record("waiter-faults", f"{alias}/{fault}", processes=2, waited_s=round(waited, 2),
               bound_s=BOUND[alias])
        assert waited <= BOUND[alias], f"granted {waited:.2f} s after the release"
    finally:
        for proc in (holder, first, second):
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.join(10)
