"""Every kind of lock on every alias of tests/settings.py, from recorded histories of 8
OS processes (django_distlock.testing's HistoryRecorder and check()): no two holds that
exclude each other overlap, no fencing token repeats, and a holder SIGKILLed while
holding frees its share (at its TTL where locks expire, at once or when its ZooKeeper
session ends otherwise) without it being granted early.

The kinds come from each backend's flags, so a kind a backend gains is checked here
without an edit. A process-local alias (locmem) is left out: across processes it must
fail the checker, which tests/test_history_checker.py shows.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils.module_loading import import_string

from django_distlock import locks
from django_distlock.backends.base import BaseLockBackend
from django_distlock.backends.database.transaction import SqliteTransactionBackend
from django_distlock.handle import Lock
from django_distlock.testing.history import HistoryRecorder, check, load

from .conftest import LIBRARY_DB, soak
from .figures import record_history
from .histories import FORK, done, fork_ready, run_forked

WORKERS = soak(8, 32)
LIMIT = 3  # the semaphores' limit
RUN_FOR = soak(0.8, 10.0)  # seconds each process keeps taking locks
KILL_TTL = 1.0  # the killed holders' lease, where locks expire
SLACK = 3.0  # how late past its bound a killed holder's share may come back


def _aliases() -> list[Any]:
    params = []
    for alias, config in settings.DISTLOCK.items():
        if not import_string(config["BACKEND"]).distributed:
            continue
        database = config["BACKEND"].endswith("DatabaseBackend")
        marks = [LIBRARY_DB] if database else []
        params.append(pytest.param(alias, marks=marks, id=alias))
    return params


ALIASES = _aliases()


def kinds_of(backend: BaseLockBackend) -> list[str]:
    """The kinds of lock the backend's flags say it offers."""
    kinds = ["exclusive"]  # (reentrant handles count in the process: no server kind)
    if backend.supports_read_write:
        kinds += ["read", "write"]
    if backend.supports_semaphore:
        kinds.append("semaphore")
    return kinds


def handle_of(backend: BaseLockBackend, kind: str, name: str, **options: Any) -> Lock:
    """A handle of ``kind`` on ``name``."""
    if kind in ("read", "write"):
        return getattr(backend, f"{kind}_lock")(name, **options)  # type: ignore[no-any-return]
    if kind == "semaphore":
        return backend.semaphore(name, LIMIT, **options)
    return backend.lock(name, **options)


def _name(base: str, kind: str) -> str:
    return f"{base}/{'rw' if kind in ('read', 'write') else kind}"


def _taker(path: Path, alias: str, base: str, start: Any, out: Any) -> None:
    """One of the 8 processes: for RUN_FOR seconds, take each kind's lock in turn (read
    or, every third turn, write), hold it a millisecond, and record every hold."""
    rec, backend = HistoryRecorder(path), locks[alias]
    kinds = [kind for kind in kinds_of(backend) if kind != "write"]
    start.wait()
    until, taken, turn = time.monotonic() + RUN_FOR, 0, os.getpid()
    while time.monotonic() < until:
        turn += 1
        for kind in kinds:
            if kind == "read" and turn % 3 == 0:  # (forked pids follow each other)
                kind = "write"
            handle = handle_of(backend, kind, _name(base, kind), timeout=30)
            with rec.hold(handle):
                time.sleep(0.001)
            taken += 1
    out.put(taken)
    done()


@pytest.mark.parametrize("alias", ALIASES)
def test_holds_of_8_processes_never_overlap(alias: str, tmp_path: Path, unique) -> None:
    path, base = tmp_path / "history.jsonl", unique("kinds")
    kinds = kinds_of(locks[alias])
    taken, exitcodes = run_forked(_taker, (path, alias, base), WORKERS, timeout=90)
    assert exitcodes == [0] * WORKERS
    events = load(path)
    report = check(events)
    record_history("kinds-history", alias, report, kinds=len(kinds))
    report.raise_if_bad()
    assert report.processes == WORKERS and report.holds == sum(taken)
    taken_kinds = {e["kind"] for e in events if e["ev"] == "invoke"}
    assert taken_kinds == set(kinds), "every kind was taken"


# -- a holder killed while holding ---------------------------------------------------


def _victim(path: Path, alias: str, kind: str, name: str, ttl: float, held: Any) -> None:
    """Take ``kind`` on ``name``, say so, and wait to be SIGKILLed."""
    rec = HistoryRecorder(path)
    with rec.hold(handle_of(locks[alias], kind, name, ttl=ttl, timeout=30)):
        held.set()
        time.sleep(120)


#: What the survivor takes to find a victim's share back: the side a holder of the
#: victim's kind keeps out.
_BLOCKED_BY = {"read": "write", "write": "read"}


def _reclaim(rec: HistoryRecorder, backend: BaseLockBackend, kind: str, name: str,
             timeout: float, killed_at: list[float], took: dict[str, float]) -> None:
    """Take what the victim's share kept out; note how long after the kill it came."""
    others = []
    if kind == "semaphore":  # the other LIMIT - 1 permits are free: only the victim's is not
        others = [backend.semaphore(name, LIMIT) for _ in range(LIMIT - 1)]
        assert all(other.acquire(blocking=False) for other in others)
    survivor = handle_of(backend, _BLOCKED_BY.get(kind, kind), name, timeout=timeout)
    try:
        with rec.hold(survivor):
            took[kind] = time.monotonic() - killed_at[0]
    finally:
        for other in others:
            other.release()


@pytest.mark.parametrize("alias", ALIASES)
def test_a_killed_holder_frees_its_share(alias: str, tmp_path: Path, unique) -> None:
    backend = locks[alias]
    path, base, kinds = tmp_path / "history.jsonl", unique("killed"), kinds_of(backend)
    expiring = backend.supports_expiry
    session = getattr(getattr(backend, "settings", None), "session_timeout", 0.0)
    bound = (KILL_TTL if expiring else session) + SLACK
    ttl = KILL_TTL if expiring else 30
    fork_ready()
    backend = locks[alias]  # built again: fork_ready() closed and forgot the first
    victims = {}
    for kind in kinds:
        held = FORK.Event()
        name = f"{base}/{kind}"
        proc = FORK.Process(target=_victim, args=(path, alias, kind, name, ttl, held))
        proc.start()
        victims[kind] = (proc, held, name)
    try:
        for kind, (_proc, held, _) in victims.items():
            assert held.wait(30), f"the {kind} victim never held"
        rec, killed_at, took = HistoryRecorder(path), [time.monotonic()], {}
        for proc, _, _ in victims.values():
            os.kill(proc.pid, signal.SIGKILL)
            if not expiring:  # held until its session or connection ends: from now on
                rec.ended(proc.pid)
        # One after another: all were killed at once, so each share comes back at the
        # same time and the first wait covers the others'.
        for kind, (_, _, name) in victims.items():
            _reclaim(rec, backend, kind, name, bound + 5, killed_at, took)
    finally:
        for proc, _, _ in victims.values():
            proc.kill()
            proc.join(10)
    assert set(took) == set(kinds), f"shares never freed: {set(kinds) - set(took)}"
    record_history("kinds-sigkill", alias, check(load(path)), kinds=len(kinds),
                   freed_s=round(max(took.values()), 2), bound_s=bound)
    assert max(took.values()) <= bound, took
    report = check(load(path))  # nobody got a share before its holder's lease ended
    if isinstance(backend, SqliteTransactionBackend):
        # Its token is the row's counter, bumped in the holder's transaction: the killed
        # grant's rollback gives its number again (docs/database.md, "Fencing tokens in
        # transaction mode"); only its own, rolled-back transaction could write with it.
        killed = {proc.pid for proc, _, _ in victims.values()}
        assert all({h.pid for h in r.holds} & killed for r in report.repeated_tokens)
        report.repeated_tokens = []
    report.raise_if_bad()
