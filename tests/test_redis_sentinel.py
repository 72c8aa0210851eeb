"""Redis behind Sentinel, and grants that survive a failover (issue 22, the seeds'
third pitfall: replication is asynchronous, so a master that dies right after a
grant may be replaced by a replica that never saw it).

The basic tests use the Sentinel set of ``scripts/test``; the failover tests start a
private set each (``tests/private_sentinel.py``) and SIGKILL its master. A
:class:`~tests.private_sentinel.Gate` between the master and its replicas holds the
replication stream back during the grants, so that without ``WAIT_REPLICAS`` the
grants are certainly lost (the double grant happens every round, not by luck); with
it, the grants are acknowledged by the replicas before ``acquire()`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_distlock import locks
from django_distlock.backends.redis.replication import InvalidReplicationOptions
from django_distlock.checks import check_distlock
from django_distlock.exceptions import (
    BackendUnavailable,
    DistLockError,
    InvalidBackendOptions,
    LockNotAcquired,
    NotReplicated,
    UnsupportedOperation,
)
from django_distlock.handle import hold_of
from django_distlock.testing.checker import HistoryReport, check
from django_distlock.testing.history import HistoryRecorder, load

from .conftest import FULL_RUN, in_thread, require_redis
from .figures import record
from .histories import FORK
from .histories import fork_ready as _fork_ready
from .private_sentinel import Sentinels

REDIS = "django_distlock.backends.redis.RedisBackend"
#: The holders' lease: still valid long after the failover.
TTL = 20.0
NAMES = 4
CONTENDERS = 2


def require_sentinel() -> str:
    """The ``redis+sentinel://`` URL of ``scripts/test``'s Sentinels (fail in a full
    run when absent, else skip)."""
    url = os.environ.get("DISTLOCK_SENTINEL_URL")
    if url:
        return url
    if FULL_RUN:
        pytest.fail("DISTLOCK_SERVERS=1 but DISTLOCK_SENTINEL_URL is not set: Sentinel is missing.")
    pytest.skip("Sentinel not started (run scripts/test for the full suite)")


@contextlib.contextmanager
def aliases(**extra: dict[str, Any]) -> Iterator[None]:
    """``settings.DISTLOCK`` with more aliases (``_`` in a keyword is ``-``)."""
    more = {alias.replace("_", "-"): params for alias, params in extra.items()}
    with override_settings(DISTLOCK={**settings.DISTLOCK, **more}):
        yield


def _sentinel_cache(url: str) -> dict[str, Any]:
    """A django-redis cache with its SentinelClient on the Sentinels of ``url``."""
    where = url.split("://", 1)[1].split("/", 1)[0]
    sentinels = [(h, int(p)) for h, p in (item.rsplit(":", 1) for item in where.split(","))]
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://distlock/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": sentinels,
            "SOCKET_TIMEOUT": 2,
        },
    }


# -- 1. a lock through the Sentinels ----------------------------------------------------


@pytest.mark.parametrize("form", ["url", "cache", "url-wait"])
def test_a_lock_through_the_sentinels(form: str, unique) -> None:
    url = require_sentinel()
    params: dict[str, Any] = {"BACKEND": REDIS, "LOCATION": url + "?socket_timeout=2"}
    if form == "cache":
        params = {"BACKEND": REDIS, "OPTIONS": {"CACHE": "sentinel"}}
    elif form == "url-wait":
        params["OPTIONS"] = {"WAIT_REPLICAS": 2}
    caches = {**settings.CACHES, "sentinel": _sentinel_cache(url)}
    name = unique("sentinel")
    with override_settings(CACHES=caches), aliases(s=params):
        backend = locks["s"]
        assert backend.check() == []
        handle = backend.lock(name, ttl=5)
        assert handle.acquire(blocking=False)
        assert backend.is_locked(name)
        assert in_thread(lambda: backend.lock(name, ttl=5).acquire(timeout=0.2)) is False
        assert [info.name for info in backend.held_locks(prefix=name).locks] == [name]
        assert backend.health() >= 0
        handle.extend(5)
        token = handle.fencing_token
        handle.release()
        assert not backend.is_locked(name)

        async def run() -> int | None:
            async with backend.lock(name, ttl=5) as held:
                other = backend.lock(name, ttl=5)
                assert await other.aacquire(blocking=False) is False
                await held.aextend(5)
                # a waiting task is woken through the master's channel
                next_holder = backend.lock(name, ttl=5)
                waiter = asyncio.ensure_future(next_holder.aacquire(timeout=3))
                await asyncio.sleep(0.2)
                assert not waiter.done()
            woken = time.monotonic()
            assert await waiter is True
            assert time.monotonic() - woken < 1.0
            await next_holder.arelease()
            return held.fencing_token

        later = asyncio.run(run())
        assert later is not None and token is not None and later > token
        # A waiter is woken by the release (the wait happens in the master).
        first = backend.lock(name, ttl=5)
        assert first.acquire(blocking=False)
        started = time.monotonic()
        waiter = _wait_in_thread(backend, name)
        time.sleep(0.3)
        first.release()
        assert waiter() is True
        assert time.monotonic() - started < 2.5


def _wait_in_thread(backend: Any, name: str) -> Any:
    """Start a blocking acquire of ``name`` in a thread; return a function that joins it
    and says whether it was granted (and releases)."""

    got: list[bool] = []

    def wait() -> None:
        handle = backend.lock(name, ttl=5)
        got.append(handle.acquire(timeout=3))
        if got[-1]:
            handle.release()

    thread = threading.Thread(target=wait)
    thread.start()

    def join() -> bool:
        thread.join(10)
        return got == [True]

    return join


# -- 2. the options: validated before any server call, and by the system check -----


@pytest.mark.parametrize(
    "options",
    [
        {"WAIT_REPLICAS": -1},
        {"WAIT_REPLICAS": True},
        {"WAIT_REPLICAS": "1"},
        {"WAIT_REPLICAS": 1, "WAIT_TIMEOUT": 0},
        {"WAIT_REPLICAS": 1, "WAIT_TIMEOUT": float("nan")},
        {"WAIT_REPLICAS": 1, "WAIT_TIMEOUT": 1e9},
        {"WAIT_TIMEOUT": 1.0},
        {"WAIT_REPLICAS": 1, "CLUSTER": True},
    ],
)
def test_bad_wait_options_are_refused_with_their_check_id(options: dict[str, Any]) -> None:
    params = {"BACKEND": REDIS, "LOCATION": "redis://127.0.0.1:1/0", "OPTIONS": options}
    with aliases(bad=params):
        with pytest.raises(InvalidReplicationOptions):
            locks["bad"]
        found = [m for m in check_distlock() if m.obj == "bad"]
        assert [m.id for m in found] == ["distlock.E012"], found


@pytest.mark.parametrize(
    "location",
    [
        "redis+sentinel:///svc",
        "redis+sentinel://127.0.0.1:1",
        "redis+sentinel://127.0.0.1:x/svc",
        "redis+sentinel://127.0.0.1:1,127.0.0.1:1/svc",
        "redis+sentinel://127.0.0.1:1/svc/db",
        "redis+sentinel://127.0.0.1:1/svc/0?nope=1",
        "redis+sentinel://127.0.0.1:1/svc/0?socket_timeout=-1",
    ],
)
def test_bad_sentinel_locations_are_refused(location: str) -> None:
    params = {"BACKEND": REDIS, "LOCATION": location}
    with aliases(bad=params), pytest.raises(InvalidBackendOptions, match="LOCATION"):
        locks["bad"]


def test_kinds_are_refused_with_wait_before_any_server_call() -> None:
    # port 1 is closed: a server call would raise BackendUnavailable instead
    params = {"BACKEND": REDIS, "LOCATION": "redis://127.0.0.1:1/0",
              "OPTIONS": {"WAIT_REPLICAS": 1}}
    with aliases(w=params):
        with pytest.raises(UnsupportedOperation, match="WAIT_REPLICAS"):
            locks["w"].read_lock("r").acquire(blocking=False)
        with pytest.raises(BackendUnavailable):  # an exclusive lock is sent
            locks["w"].lock("r").acquire(blocking=False)


# -- 3. a grant the replicas do not acknowledge ------------------------------------------


def _private(tmp_path: Path) -> Sentinels:
    require_redis()
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is not installed (scripts/servers.py install)")
    return Sentinels(tmp_path)


def test_a_grant_not_acknowledged_is_undone(tmp_path: Path, unique) -> None:
    s = _private(tmp_path)
    name = unique("unacked")
    params = {"BACKEND": REDIS, "LOCATION": s.url("socket_timeout=2"),
              "OPTIONS": {"WAIT_REPLICAS": 1, "WAIT_TIMEOUT": 0.3}}
    try:
        with aliases(w=params):
            backend = locks["w"]
            s.gate.hold()
            started = time.monotonic()
            with pytest.raises(NotReplicated, match="grant was undone"):
                backend.lock(name, ttl=10).acquire(blocking=False)
            assert 0.25 < time.monotonic() - started < 2
            with pytest.raises(NotReplicated):
                asyncio.run(backend.lock(name, ttl=10).aacquire(blocking=False))
            assert not backend.is_locked(name)  # undone on the master
            s.gate.open()
            handle = backend.lock(name, ttl=10)
            assert handle.acquire(blocking=False)
            until = hold_of(handle).valid_until
            s.gate.hold()
            # An extension not acknowledged: refused, the lease keeps its replicated end.
            with pytest.raises(NotReplicated, match="previous end"):
                handle.extend(30)
            assert hold_of(handle).valid_until == until and not handle.lost
            handle.release()  # a release does not wait for the replicas
            assert not backend.is_locked(name)
            s.gate.open()
    finally:
        s.stop()


# -- 4. the master killed right after grants ----------------------------------------------


def _contend(alias: str, names: list[str], path: str) -> None:
    """A contender process: once the new master answers, try each name once."""
    deadline = time.monotonic() + 15
    while True:  # until this process' clients reach the promoted master
        try:
            locks[alias].is_locked(names[0])
            break
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    recorder = HistoryRecorder(path)
    for name in names:
        with contextlib.suppress(LockNotAcquired), recorder.hold(
            locks[alias].lock(name, ttl=TTL, blocking=False)
        ):
            pass


def _failover_round(
    s: Sentinels, alias: str, names: list[str], path: Path, held: tuple[int, ...]
) -> tuple[list[Any], float]:
    """Grant ``names`` to this process with the replication to the replicas ``held``
    held back, SIGKILL the master, wait for Sentinel's failover, then let CONTENDERS
    processes try them. Returns the holders (op, handle) and the failover's seconds."""
    recorder = HistoryRecorder(path)
    backend = locks[alias]
    backend.is_locked(names[0])  # connected, offset and eviction checks done
    for i in held:
        s.gate.each[i].hold()
    holders = []
    for name in names:
        handle = backend.lock(name, ttl=TTL, blocking=False)
        op = recorder.invoke(name)
        assert handle.acquire()
        recorder.granted(op, handle.fencing_token, hold_of(handle).valid_until)
        holders.append((op, handle))
    killed = s.kill_master()
    s.gate.cut()  # what it held is lost with the master
    took = s.wait_failover() - killed
    s.wait_replica()  # so that WAIT_REPLICAS = 1 can be met again
    _fork_ready()
    procs = [FORK.Process(target=_contend, args=(alias, names, str(path)))
             for _ in range(CONTENDERS)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    return holders, took


def _end(holders: list[Any], path: Path) -> HistoryReport:
    recorder = HistoryRecorder(path)
    for op, handle in holders:
        recorder.released(op)
        with contextlib.suppress(DistLockError):
            handle.release()
    recorder.close()
    return check(load(path))


def _figures(backend: str, report: HistoryReport, took: float,
             scenario: str = "sentinel-failover") -> None:
    record(scenario, backend, processes=report.processes,
           acquisitions=report.holds, overlaps=len(report.overlaps),
           repeated_tokens=len(report.repeated_tokens), time_to_failover_s=round(took, 2))


def test_without_wait_a_failover_grants_the_lock_twice(tmp_path: Path, unique) -> None:
    s = _private(tmp_path)
    names = [unique(f"lost{i}") for i in range(NAMES)]
    path = tmp_path / "history.jsonl"
    try:
        with aliases(plain={"BACKEND": REDIS, "LOCATION": s.url("socket_timeout=1")}):
            holders, took = _failover_round(s, "plain", names, path, held=(0, 1))
            report = _end(holders, path)
    finally:
        s.stop()
    _figures("redis-sentinel", report, took)
    # The seeds' third pitfall, shown: the promoted replica never saw the grants.
    assert len(report.overlaps) >= 1, report
    # Fencing still holds: the new master's tokens come from its clock (µs), above
    # every token the dead master gave.
    assert report.repeated_tokens == [], report
    events = load(path)
    first = max(h.fencing_token for _, h in holders)
    later = [e["token"] for e in events if e["ev"] == "granted" and e["pid"] != os.getpid()]
    assert later and min(later) > first


@pytest.mark.parametrize("lagging", [False, True])
def test_with_wait_a_failover_keeps_every_grant(lagging: bool, tmp_path: Path, unique) -> None:
    """WAIT_REPLICAS = 1 of 2 replicas; with ``lagging``, the grants reach only one of
    them: Sentinel must promote that one (the furthest ahead)."""
    s = _private(tmp_path)
    names = [unique(f"kept{i}") for i in range(NAMES)]
    path = tmp_path / "history.jsonl"
    params = {"BACKEND": REDIS, "LOCATION": s.url("socket_timeout=1"),
              "OPTIONS": {"WAIT_REPLICAS": 1, "WAIT_TIMEOUT": 0.5}}
    try:
        with aliases(waited=params):
            holders, took = _failover_round(s, "waited", names, path, held=(1,) if lagging else ())
            backend = locks["waited"]
            if lagging:  # the one that has the grants, not the one that lagged
                assert s.master_port() == s.replicas[0].port
            assert all(backend.is_locked(name) for name in names)  # on the new master
            first = max(h.fencing_token for _, h in holders)
            report = _end(holders, path)
            assert not any(backend.is_locked(name) for name in names)  # released there
            after = backend.lock(names[0], ttl=5)
            assert after.acquire(blocking=False)
            assert after.fencing_token is not None and after.fencing_token > first
            after.release()
    finally:
        s.stop()
    # the lagging variant is a scenario of its own: one replica never got the grants
    scenario = "sentinel-failover-lagging-replica" if lagging else "sentinel-failover"
    _figures("redis-sentinel-wait", report, took, scenario)
    assert report.ok, report
    assert report.holds == NAMES  # the contenders got none of them


# -- 5. the catalogue's mixed run, through the Sentinels with WAIT ------------------------


def test_a_mixed_run_through_the_sentinels_with_wait(unique, tmp_path: Path) -> None:
    from .test_hostile import PROCESSES, assert_history_good, mixed_run

    url = require_sentinel()
    params = {"BACKEND": REDIS, "LOCATION": url, "OPTIONS": {"WAIT_REPLICAS": 2}}
    path = tmp_path / "history.jsonl"
    with aliases(redis_sentinel=params):
        results = mixed_run("redis-sentinel", unique("mixed"), PROCESSES, path)
    assert {kind for kind, held in results if held} == {"task", "thread", "process"}, results
    report = assert_history_good(path)
    assert report.holds == sum(held for _, held in results)
