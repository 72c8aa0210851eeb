"""tests/test_hostile.py's scenarios on the kinds (issue 22): read-write locks and
semaphores on every backend that offers them.

1. a mixed run: asyncio tasks, threads and forked processes taking readers, writers
   and permits; the recorded history checked (writers overlap nothing, readers never a
   writer, at most LIMIT permits, writers' tokens grow in grant order);
2. ``aacquire()`` of each kind cancelled at
   random points while a holder of the conflicting kind comes and goes: nothing is
   left held;
3. a release of each kind that fails (the server frozen): a library exception within
   the bound, no false loss once the server answers, the name free again.

The server restarted and a waiter's entry deleted: tests/test_hostile_kinds_servers.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from django_distlock import locks
from django_distlock.backends.database.sessions import WATCHDOG_GRACE
from django_distlock.exceptions import BackendUnavailable, LockLost
from django_distlock.handle import hold_of
from django_distlock.testing.history import check, load

from .conftest import LIBRARY_DB, eventually
from .figures import record
from .kinds_catalogue import (
    KIND_ALIASES,
    KINDS,
    NO_KINDS,
    SAME_AS,
    free_for_all,
    hold_all,
    kinds_offered,
    mixed,
    of_kind,
    record_history,
)
from .test_hostile import (  # noqa: F401  (fixtures: redis_servers, zookeeper)
    ALIASES,
    FAULT_TTL,
    GIVE_UP,
    PROCESSES,
    _cancel_many,
    _cancel_on_free_names,
    _release_fault,
    _release_retrying,
    mixed_run,
    redis_servers,
    require,
    zookeeper,
)

pytestmark = LIBRARY_DB


@pytest.mark.parametrize("alias", ALIASES)
def test_every_alias_has_its_kinds_run_or_a_reason(alias: str) -> None:
    """The lists above follow the backends' flags: a kind gained is a kind tested."""
    require(alias)
    offered = kinds_offered(locks[alias])
    assert (offered == []) == (alias in NO_KINDS), (alias, offered)
    if offered:
        assert (alias in KIND_ALIASES) != (alias in SAME_AS), alias
        assert offered == KINDS, (alias, offered)  # every alias with kinds has all three


# -- 1. a mixed run of readers, writers and permits ---------------------------------


@pytest.mark.parametrize("alias", KIND_ALIASES)
def test_a_mixed_run_of_kinds_never_overlaps(alias: str, unique, tmp_path: Path) -> None:
    require(alias)
    path, name = tmp_path / "history.jsonl", unique("mixed-kinds")
    results = mixed_run(alias, name, PROCESSES, path, make=mixed)
    assert {kind for kind, held in results if held} == {"task", "thread", "process"}, results
    events = load(path)
    report = check(events)
    report.raise_if_bad()
    assert report.holds == sum(held for _, held in results)
    kind_of = {e["op"]: e["kind"] for e in events if e["ev"] == "invoke"}
    granted = [kind_of[e["op"]] for e in events if e["ev"] == "granted"]
    assert set(granted) == set(KINDS), granted
    if locks[alias].supports_fencing:  # every writer's hold wrote its token
        assert report.writes == granted.count("write"), (report.writes, granted)
    record_history("mixed-kinds", alias, report, events, bound_s=GIVE_UP,
                   threads=4, tasks=20)


# -- 2. cancelled acquires of each kind ------------------------------------------------


# (A reentrant handle's first acquire is an exclusive one, and its others make no call.)
CANCELLED = [(alias, kind) for alias in KIND_ALIASES for kind in KINDS]


@pytest.mark.parametrize(("alias", "kind"), CANCELLED)
def test_cancelled_acquires_of_a_kind_leave_nothing_held(alias: str, kind: str, unique) -> None:
    """A holder of the conflicting kind (all LIMIT permits, for a semaphore) comes and
    goes while ``aacquire()``s of ``kind`` are cancelled; afterwards the name is free
    (a leaked reader or permit would keep the writer or the LIMIT permits out)."""
    require(alias)
    backend, name = locks[alias], unique(f"cancelled-{kind}")
    stop, cycles, missed = threading.Event(), [0], []

    def holder() -> None:
        from django.db import connections

        try:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    handles = hold_all(backend, kind, name, ttl=30)
                except AssertionError:  # a cancelled grant not yet given back
                    if time.monotonic() - began > 2:
                        missed.append(began)
                    time.sleep(0.005)
                    continue
                time.sleep(0.003)
                for handle in handles:
                    handle.release()
                cycles[0] += 1
                time.sleep(0.002)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    began = time.monotonic()
    try:
        assert eventually(lambda: cycles[0] > 0, timeout=5)  # the holder comes and goes
        cancelled, granted = _cancel_many(
            alias, name, lambda b, n, **o: of_kind(b, kind, n, **o))
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert cancelled >= 20 and cycles[0] > 0, (cancelled, cycles)
    assert eventually(lambda: free_for_all(backend, kind, name), timeout=5)
    assert missed == []
    record("cancelled-kinds", f"{alias}/{kind}", processes=1, acquisitions=cancelled + granted,
           cancelled=cancelled, granted=granted, holder_cycles=cycles[0],
           worst_call_s=round(time.monotonic() - began, 3), overlaps=0)


@pytest.mark.parametrize(("alias", "kind"), CANCELLED)
def test_an_acquire_of_a_kind_cancelled_on_a_free_name_leaves_it_free(
    alias: str, kind: str, unique
) -> None:
    """``aacquire()``s of ``kind`` on names nobody holds, cancelled in flight: a grant
    that came for a cancelled task is given back (tests/test_hostile.py's scenario)."""
    require(alias)
    backend = locks[alias]
    cancelled = _cancel_on_free_names(
        alias, unique, lambda b, n, **o: of_kind(b, kind, n, **o))
    record("cancelled-free-kinds", f"{alias}/{kind}", cancelled=len(cancelled))
    left = [name for name in cancelled
            if not eventually(lambda n=name: free_for_all(backend, kind, n), timeout=5)]
    assert left == []


# -- 3. a release of each kind that fails ------------------------------------------------

#: Where the release of a kind cannot be made to fail, and why (the kinds' aliases only).
NO_RELEASE_FAULT = {
    "sqlite-lease": "SQLite is a file this process opens: no server to stop",
    "redis-unfair": "'redis' frozen: the same kind scripts, no queue in the release",
    "redis-cluster": "a private 3-master cluster is beyond the budget (test_hostile.py)",
}
RELEASE_FAULTS = ["redis", "pg-lease", "mysql-lease", "zk"]


def test_every_kinds_alias_has_its_release_fail_or_a_reason() -> None:
    assert set(RELEASE_FAULTS) | set(NO_RELEASE_FAULT) == set(KIND_ALIASES)


def _lost_only_when_ended(handle: Any, exc: BaseException) -> None:
    """A loss reported only once the handle's lease had ended (the releases come one after
    another under the fault: the later ones may find their leases over, and say so)."""
    if isinstance(exc, LockLost):
        until = hold_of(handle).valid_until
        assert until is not None and time.monotonic() >= until, exc
    else:
        assert isinstance(exc, BackendUnavailable) and exc.__cause__ is not None, exc


@pytest.mark.parametrize("alias", RELEASE_FAULTS)
def test_a_release_of_each_kind_that_fails(alias: str, request: pytest.FixtureRequest) -> None:
    """A reader, a writer (of another name) and a permit held, the server frozen: the
    first release raises ``BackendUnavailable`` chained to its cause within the lease's
    end plus a grace; the others that or ``LockLost`` once their lease ended; retried
    once the server answers, none reports a loss while its lease lasted; all free."""
    require(alias)
    base = f"kinds-released-under-fault-{alias}-{time.monotonic_ns()}"
    bound = FAULT_TTL + WATCHDOG_GRACE + 2
    with _release_fault(alias, request) as (backend, fault):
        handles = {kind: of_kind(backend, kind, f"{base}/{kind}", ttl=FAULT_TTL)
                   for kind in KINDS}
        for handle in handles.values():
            assert handle.acquire(timeout=5)
        took: dict[str, float] = {}
        pending = []
        with fault(next(iter(handles.values()))):
            for kind, handle in handles.items():
                began = time.monotonic()
                with pytest.raises((BackendUnavailable, LockLost)) as caught:
                    handle.release()
                took[kind] = time.monotonic() - began
                assert took[kind] < bound, (kind, took)
                _lost_only_when_ended(handle, caught.value)
                if kind == KINDS[0]:
                    assert isinstance(caught.value, BackendUnavailable), caught.value
                if isinstance(caught.value, BackendUnavailable):
                    pending.append(handle)
        for handle in pending:
            try:
                _release_retrying(handle)
            except LockLost as exc:
                _lost_only_when_ended(handle, exc)
        for kind in KINDS:
            assert eventually(lambda k=kind: free_for_all(backend, k, f"{base}/{k}"),
                              timeout=FAULT_TTL + 3), kind
    for kind in KINDS:
        record("release-fails-kinds", f"{alias}/{kind}", processes=1, acquisitions=1,
               worst_call_s=round(took[kind], 3), bound_s=bound, overlaps=0)


def test_a_late_release_of_a_share_gets_its_answer(unique) -> None:
    """Found by the release fault above (PostgreSQL): a reader's or a permit's release
    sent past its lease's end plus the watchdog's grace was watched until that past
    moment, so the watchdog cut every attempt at once: ``BackendUnavailable`` forever
    (and a connection cut per call) instead of the server's answer, ``LockLost``. The
    exclusive release watches such a call for the grace from now; so do shares now."""
    require("pg-lease")
    handles = [of_kind(locks["pg-lease"], kind, unique(f"late-{kind}"), ttl=0.5)
               for kind in ("read", "semaphore")]
    for handle in handles:
        assert handle.acquire(blocking=False)
    time.sleep(0.5 + WATCHDOG_GRACE + 0.3)
    for handle in handles:
        with pytest.raises(LockLost):
            handle.release()
