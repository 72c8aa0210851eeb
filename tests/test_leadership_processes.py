"""Leadership with OS processes on every backend that can lead: campaigners whose terms
the history checker confirms (no two at once, epochs strictly growing), a leader
SIGKILLed (replaced within its lease, or ZooKeeper's session timeout), a leader
SIGSTOPped past its lease (replaced; resumed, it finds its term lost and the database
refuses its epoch's write)."""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import pytest

from django_distlock.exceptions import StaleFencingToken
from django_distlock.handle import hold_of
from django_distlock.leadership import LEADER_PREFIX, Leader, Term
from django_distlock.testing import HistoryRecorder, check, load

from .conftest import LIBRARY_DB, require_alias, soak
from .figures import record, record_history
from .histories import FORK, done, fork_ready
from .testapp.fencing_models import FencedItem

pytestmark = LIBRARY_DB

LEADERS = ["sqlite-lease", "pg-lease", "mysql-lease", "redis", "redis-cluster", "zk"]
#: The terms' lease (s); ZooKeeper's session timeout in tests/settings.py (s), and the
#: ensemble's tickTime (scripts/servers.py): it expires sessions in buckets of a tick,
#: so up to a tick after their timeout.
TTL = 2.0
SESSION_TIMEOUT, TICK = 4.0, 2.0
#: How long after the lease (or session) could end a new leader may take to lead: the
#: waiter's wake-up and a round trip, on a busy 2-core machine.
SLACK = 1.5


def _lasts(alias: str) -> float:
    """The longest a dead leader's term lasts on ``alias``."""
    return SESSION_TIMEOUT + TICK if alias.startswith("zk") else TTL


def _campaigner(alias: str, name: str, path: str, terms: int, hold: float, start: Any,
                out: Any) -> None:
    recorder = HistoryRecorder(path)
    stop = threading.Event()
    led: list[int] = []

    def lead(term: Term) -> None:
        op = recorder.invoke(LEADER_PREFIX + name)
        recorder.granted(op, term.epoch, hold_of(term.lock).valid_until)
        term.wait_lost(timeout=hold)
        if term.lost:
            recorder.lost(op)
        recorder.released(op)
        led.append(term.epoch)
        if len(led) == terms:
            stop.set()

    start.wait()
    Leader(name, using=alias, ttl=TTL).campaign(lead, stop=stop, poll=30)
    recorder.close()
    out.put(led)
    done()


@pytest.mark.parametrize("alias", LEADERS)
def test_campaigners_lead_one_at_a_time_with_growing_epochs(alias: str, tmp_path: Path,
                                                             unique) -> None:
    require_alias(alias)
    name, path = unique("campaign"), str(tmp_path / "terms.jsonl")
    workers, terms = soak(5, 10), soak(2, 10)
    fork_ready()
    start, out = FORK.Event(), FORK.Queue()
    procs = [FORK.Process(target=_campaigner,
                          args=(alias, name, path, terms, 0.05, start, out))
             for _ in range(workers)]
    for proc in procs:
        proc.start()
    start.set()
    try:
        led = [out.get(timeout=120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    assert [proc.exitcode for proc in procs] == [0] * workers
    assert all(len(epochs) == terms for epochs in led)
    report = check(load(path))
    record_history("leadership-campaign", alias, report, terms=report.holds)
    assert report.holds == workers * terms
    assert report.ok, report  # no overlap, no repeated epoch, none out of order
    assert not report.overlaps_after_loss


def _leader(alias: str, name: str, item: int, conn: Any) -> None:
    """Lead, write under the epoch, tell the test (over this process' own pipe); told
    "resume", report what it sees and whether the database takes its epoch's write;
    told "stop", end the term.

    Each process has a pipe of its own, and nothing else shared with the others: a
    process SIGKILLed or SIGSTOPped while it held a lock of a shared queue or event
    would block the other's messages (the test failed once so: a leader killed just
    as its queue's feeder thread had written "led" held the queue's lock for good)."""

    def lead(term: Term) -> None:
        FencedItem.objects.filter(pk=item).fenced_update(term.epoch, stock=term.epoch)
        conn.send(("led", os.getpid(), term.epoch, time.monotonic()))
        if conn.recv() == "stop":
            stop.set()
            return
        seen_at_once = term.lost
        try:
            FencedItem.objects.filter(pk=item).fenced_update(term.epoch, label="stale")
            refused = False
        except StaleFencingToken:
            refused = True
        conn.send(("resumed", os.getpid(), seen_at_once, refused, term.wait_lost(timeout=10)))
        stop.set()

    stop = threading.Event()
    Leader(name, using=alias, ttl=TTL).campaign(lead, stop=stop, poll=60)
    done()


def _two_leaders(alias: str, name: str, item: int) -> tuple[list[Any], dict[int, Any]]:
    """Two campaigning processes, and the test's end of each one's pipe by pid."""
    fork_ready()
    procs, pipes = [], {}
    for _ in range(2):
        ours, theirs = FORK.Pipe()
        proc = FORK.Process(target=_leader, args=(alias, name, item, theirs))
        proc.start()
        theirs.close()
        procs.append(proc)
        pipes[proc.pid] = ours
    return procs, pipes


def _next(pipes: dict[int, Any], timeout: float) -> Any:
    """The next message of any of the processes (a process gone is left out)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        ready = wait(list(pipes.values()), max(left, 0))
        for conn in ready:
            try:
                return conn.recv()
            except EOFError:  # that process died: wait for the other
                pipes = {pid: c for pid, c in pipes.items() if c is not conn}
        assert ready or left > 0, f"no message within {timeout} s"
        assert pipes, "every process is gone"


def _end(procs: list[Any]) -> None:
    for proc in procs:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.join(10)


@pytest.mark.parametrize("alias", LEADERS)
def test_a_killed_leader_is_replaced_within_its_lease(alias: str, unique) -> None:
    require_alias(alias)
    item = FencedItem.objects.create(label="killed").pk
    procs, pipes = _two_leaders(alias, unique("killed"), item)
    try:
        _, first, epoch, _ = _next(pipes, 60)
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        _, second, newer, led = _next(pipes, _lasts(alias) + 30)
    finally:
        _end(procs)
    failover = led - killed
    record("leader-killed", alias, failover_s=round(failover, 3), lasts_s=_lasts(alias))
    assert second != first and newer > epoch
    assert failover <= _lasts(alias) + SLACK
    assert FencedItem.objects.get(pk=item).stock == newer


@pytest.mark.parametrize("alias", LEADERS)
def test_a_paused_leader_is_replaced_and_resumed_finds_its_term_lost(alias: str,
                                                                      unique) -> None:
    """SIGSTOP past the lease: another leads; SIGCONT: the old leader's term is lost at
    once (its lease, or ZooKeeper's sure life of its session, ran out on its own clock
    while it was stopped) and the database refuses a write with its epoch."""
    require_alias(alias)
    item = FencedItem.objects.create(label="paused").pk
    procs, pipes = _two_leaders(alias, unique("paused"), item)
    try:
        _, first, epoch, _ = _next(pipes, 60)
        os.kill(first, signal.SIGSTOP)
        stopped = time.monotonic()
        _, second, newer, led = _next(pipes, _lasts(alias) + 30)
        os.kill(first, signal.SIGCONT)
        pipes[first].send("resume")
        pipes[second].send("stop")
        _, pid, seen_at_once, refused, lost = _next({first: pipes[first]}, 30)
        for proc in procs:
            proc.join(30)
    finally:
        _end(procs)
    record("leader-paused", alias, takeover_s=round(led - stopped, 3),
           lost_at_once=seen_at_once)
    assert second != first and newer > epoch and pid == first
    assert led - stopped <= _lasts(alias) + SLACK
    assert seen_at_once and refused and lost
    item_now = FencedItem.objects.get(pk=item)
    assert (item_now.stock, item_now.label) == (newer, "paused")
    assert [proc.exitcode for proc in procs] == [0, 0]
