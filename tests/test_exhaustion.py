"""Connection exhaustion (issue 22): more waiters than the backend's connections.

A holder holds a name; more waiting threads (or asyncio tasks) than the alias has
connections wait for it with a timeout; the holder releases after a while. Every
waiter's call comes back within its timeout plus a grace, each with a grant, a miss
(``LockNotAcquired``) or a library exception (``BackendUnavailable``), never a bare
client error; the recorded holds never overlap; the name ends free. Memory pressure
(eviction) is tests/test_redis_eviction.py's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from redis.exceptions import MaxConnectionsError

from django_distlock.exceptions import BackendUnavailable, DistLockError, LockNotAcquired
from django_distlock.handle import hold_of
from django_distlock.testing.history import HistoryRecorder, check, load

from .conftest import LIBRARY_DB, eventually, require_pg, require_redis
from .figures import record
from .kinds_catalogue import worst_call_s
from .test_hostile import _free_now, private_backend

pytestmark = LIBRARY_DB

WAITERS = 12
HOLD = 1.0  # the holder's hold, while every waiter waits
TIMEOUT = 2.5  # each waiter's
GRACE = 2.0  # how late past its timeout a call may come back

#: The pools made small, and what runs against them.
CASES = {
    "redis-threads": ("redis", "?max_connections=3", {}, "threads"),
    "redis-tasks": ("redis", "?max_connections=3", {}, "tasks"),
    "pg-lease-tasks": ("pg-lease", None, {"ASYNC_SESSIONS": 2}, "tasks"),
}
#: Where no pool of the library's can run out, and why.
NO_EXHAUSTION = {
    "pg-lease threads": "one session per thread: the server's max_connections is shared "
    "with every other test database on this server; not exhausted here",
    "pg-tx, sqlite": "Django's connection of each thread: no pool of ours",
    "zk": "one ZooKeeper session per backend and process, every call multiplexed on it: "
    "no pool to exhaust",
    "redlock": "'redis' pools, one per master: the 'redis' cases cover the pool",
    "redis-cluster": "not exhausted here: its calls go through redis-py's cluster client "
    "(a pool per node), not the kept-connection path the 'redis' cases test",
    "cache-*": "the Django cache's own client: its pool is the cache's, not the library's",
}


def _backend(case: str) -> Any:
    alias, query, options, _ = CASES[case]
    if alias == "pg-lease":
        require_pg()
        params = dict(settings.DISTLOCK[alias])
        return private_backend(alias, params.get("LOCATION"), **options)
    require_redis()
    return private_backend(alias, settings.DISTLOCK[alias]["LOCATION"] + query, **options)


def _outcome(exc: BaseException | None) -> str:
    if exc is None:
        return "granted"
    if isinstance(exc, LockNotAcquired):
        return "miss"
    if isinstance(exc, BackendUnavailable):
        return "unavailable"
    return f"other: {exc!r}"


def _threads(backend: Any, name: str, rec: HistoryRecorder) -> list[tuple[str, float]]:
    found: list[tuple[str, float]] = []

    def wait() -> None:
        began, error = time.monotonic(), None
        try:
            _hold_recorded(rec, backend.lock(name, ttl=30))
        except BaseException as exc:
            error = exc
        finally:
            connections.close_all()
        found.append((_outcome(error), time.monotonic() - began))

    threads = [threading.Thread(target=wait) for _ in range(WAITERS)]
    for thread in threads:
        thread.start()
    return _joined(threads, found)


def _hold_recorded(rec: HistoryRecorder, handle: Any) -> None:
    """``rec.hold(handle)``, but a pool that refused a connection is a known failure: no
    command was written (``Wire.send`` asks the pool before writing), so the attempt
    holds nothing, where the recorder would count any ``BackendUnavailable`` as held
    until its TTL."""
    op = rec.invoke(handle.name)
    try:
        if not handle.acquire(timeout=TIMEOUT):
            rec.failed(op)
            raise LockNotAcquired(f"{handle.name} not acquired")
    except BackendUnavailable as exc:
        if isinstance(exc.__cause__, MaxConnectionsError):
            rec.failed(op, exc)
        else:
            rec.unknown(op, handle.options.ttl)
        raise
    rec.granted(op, handle.fencing_token, hold_of(handle).valid_until)
    time.sleep(0.01)
    rec.released(op)  # before the release, as rec.hold() records it
    handle.release()


def _joined(threads: list[threading.Thread], found: list[Any]) -> list[Any]:
    for thread in threads:
        thread.join(TIMEOUT + GRACE + 10)
        assert not thread.is_alive()
    return found


def _tasks(backend: Any, name: str, rec: HistoryRecorder) -> list[tuple[str, float]]:
    async def wait() -> tuple[str, float]:
        began, error = time.monotonic(), None
        try:
            async with rec.ahold(backend.lock(name, ttl=30, timeout=TIMEOUT)):
                await asyncio.sleep(0.01)
        except DistLockError as exc:
            error = exc
        return _outcome(error), time.monotonic() - began

    async def run() -> list[tuple[str, float]]:
        return list(await asyncio.gather(*(wait() for _ in range(WAITERS))))

    found: list[Any] = []
    thread = threading.Thread(target=lambda: found.extend(asyncio.run(run())))
    thread.start()
    return _joined([thread], found)


@pytest.mark.parametrize("case", sorted(CASES))
def test_more_waiters_than_connections(case: str, unique, tmp_path: Path) -> None:
    backend, name = _backend(case), unique("exhausted")
    path = tmp_path / "history.jsonl"
    rec = HistoryRecorder(path)
    try:
        holder = backend.lock(name, ttl=30)
        with rec.hold(holder):
            results: list[tuple[str, float]] = []
            run = _threads if CASES[case][3] == "threads" else _tasks
            waiting = threading.Thread(target=lambda: results.extend(run(backend, name, rec)))
            waiting.start()
            time.sleep(HOLD)
        waiting.join(TIMEOUT + GRACE + 15)
        assert not waiting.is_alive()
        rec.close()
        outcomes = [outcome for outcome, _ in results]
        assert len(outcomes) == WAITERS
        assert [o for o in outcomes if o.startswith("other")] == [], outcomes
        assert "granted" in outcomes, outcomes  # the pool still serves, once free
        worst = max(took for _, took in results)
        assert worst < TIMEOUT + GRACE, results
        events = load(path)
        report = check(events)
        report.raise_if_bad()
        assert eventually(lambda: _free_now(backend, name), timeout=5)
    finally:
        backend.close()
    record("exhaustion", case, processes=1, acquisitions=report.holds, waiters=WAITERS,
           granted=outcomes.count("granted"), missed=outcomes.count("miss"),
           unavailable=outcomes.count("unavailable"), overlaps=len(report.overlaps),
           repeated_tokens=len(report.repeated_tokens), worst_call_s=round(worst, 3),
           worst_acquire_s=worst_call_s(events), bound_s=TIMEOUT + GRACE)

