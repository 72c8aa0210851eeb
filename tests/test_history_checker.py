"""The shipped history checker: histories made to be wrong are caught, right ones pass,
and real runs of forked workers pass on shared backends and fail on a process-local one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from django_distlock import locks
from django_distlock.backends.redis import RedisBackend
from django_distlock.exceptions import BackendUnavailable, LockLost, LockTimeout, StaleFencingToken
from django_distlock.testing.history import HistoryRecorder, HistoryReport, check, load, stock

from .conftest import LIBRARY_DB, in_thread, needs_pg, require_pg, require_redis
from .histories import FORK, done, fork_ready
from .testapp.fencing_models import FencedItem


@pytest.fixture
def rec(tmp_path: Path) -> HistoryRecorder:
    return HistoryRecorder(tmp_path / "history.jsonl")


def checked(rec: HistoryRecorder, **options: Any) -> HistoryReport:
    return check(load(rec.path), **options)


def test_the_history_module_needs_no_pytest() -> None:
    code = (
        "import sys; sys.modules['pytest'] = None\n"  # an import of pytest would fail
        "from django_distlock.testing.history import HistoryRecorder, check\n"
        "import django_distlock.testing as t; assert t.check is check"
    )
    assert os.system(f"{sys.executable} -c \"{code}\"") == 0


def test_holds_one_after_another_pass(rec: HistoryRecorder) -> None:
    for token in (1, 2, 3):
        op = rec.invoke("x")
        rec.granted(op, token)
        rec.write("x", token, True)
        rec.released(op)
    report = checked(rec)
    assert report.ok and report.holds == 3 and report.processes == 1 and report.writes == 3
    report.raise_if_bad()


def test_two_exclusive_holds_that_overlap_are_caught(rec: HistoryRecorder) -> None:
    a, b = rec.invoke("x"), rec.invoke("x")
    rec.granted(a, 1)
    rec.granted(b, 2)
    rec.released(a)
    rec.released(b)
    report = checked(rec)
    assert not report.ok
    assert [[h.op for h in o.holds] for o in report.overlaps] == [[a.id, b.id]]
    with pytest.raises(AssertionError, match=f"overlap on 'x': exclusive hold {a.id}"):
        report.raise_if_bad()


def test_other_names_and_touching_holds_do_not_overlap(rec: HistoryRecorder) -> None:
    a, b, c = rec.invoke("x"), rec.invoke("y"), rec.invoke("x")
    rec.granted(a, 1)
    rec.granted(b, 1)
    rec.released(a)
    rec.granted(c, 2)
    rec.released(b)
    rec.released(c)
    assert checked(rec).ok


def test_readers_share_and_a_writer_excludes_them(rec: HistoryRecorder) -> None:
    r1, r2 = rec.invoke("x", "read"), rec.invoke("x", "read")
    rec.granted(r1, 1)
    rec.granted(r2, 2)
    rec.released(r1)
    rec.released(r2)
    assert checked(rec).ok
    r3, w = rec.invoke("x", "read"), rec.invoke("x", "write")
    rec.granted(r3, 3)
    rec.granted(w, 4)
    rec.released(w)
    rec.released(r3)
    report = checked(rec)
    assert [[h.kind for h in o.holds] for o in report.overlaps] == [["read", "write"]]


def test_a_semaphore_admits_its_limit_and_not_one_more(rec: HistoryRecorder) -> None:
    ops = [rec.invoke("s", "semaphore", limit=2) for _ in range(3)]
    rec.granted(ops[0], 1)
    rec.granted(ops[1], 2)
    rec.released(ops[0])
    rec.granted(ops[2], 3)  # two at a time: fine
    assert checked(rec).ok
    extra = rec.invoke("s", "semaphore", limit=2)
    rec.granted(extra, 4)  # the third at once
    rec.released(extra)
    report = checked(rec)
    assert [[h.op for h in o.holds] for o in report.overlaps] == [[ops[1].id, ops[2].id, extra.id]]


def test_a_fencing_token_granted_twice_is_caught(rec: HistoryRecorder) -> None:
    for _ in range(2):
        op = rec.invoke("x")
        rec.granted(op, 7)
        rec.released(op)
    report = checked(rec)
    assert [(r.name, r.token, len(r.holds)) for r in report.repeated_tokens] == [("x", 7, 2)]
    assert "token 7 of 'x' granted 2 times" in str(report)


def test_a_grant_with_a_lower_token_than_the_one_before_is_caught(rec: HistoryRecorder) -> None:
    """Tokens grow with every grant (a leadership term's epoch is one): a later valid
    hold of the name with a lower token is caught; other names, reads, semaphores, and
    a hold that was never valid (granted after its lease had ended) are not compared."""
    for name, token in (("x", 5), ("y", 1), ("x", 6)):
        op = rec.invoke(name)
        rec.granted(op, token)
        rec.released(op)
    for kind, token in (("read", 2), ("semaphore", 1)):
        op = rec.invoke("x", kind, limit=2 if kind == "semaphore" else None)
        rec.granted(op, token)
        rec.released(op)
    stale = rec.invoke("x")
    rec.granted(stale, 3, valid_until=time.monotonic() - 1)  # its lease had ended
    rec.released(stale)
    assert checked(rec).ok
    late = rec.invoke("x", "write")
    rec.granted(late, 4)
    rec.released(late)
    report = checked(rec)
    assert [(a.token, b.token) for a, b in report.tokens_out_of_order] == [(6, 4)]
    assert "token 4 of 'x' granted after token 6" in str(report)
    assert not report.ok


def test_an_accepted_write_with_a_lower_token_is_caught(rec: HistoryRecorder) -> None:
    rec.write("x", 5, True)
    rec.write("x", 4, False)  # refused: fine
    rec.write("y", 1, True)  # another name: fine
    assert checked(rec).ok
    rec.write("x", 4, True)
    report = checked(rec)
    assert [(a.token, b.token) for a, b in report.backwards_writes] == [(5, 4)]
    assert "write of 'x' with token 4" in str(report)


def test_writes_in_flight_together_may_land_in_either_order(rec: HistoryRecorder) -> None:
    began = time.monotonic_ns()  # the token-4 write was sent before the token-5 one answered
    rec.write("x", 5, True)
    rec.write("x", 4, True, began=began)
    assert checked(rec).ok


def test_the_stock_invariant(rec: HistoryRecorder) -> None:
    for left in (2, 1, 0):
        rec.write("x", 3 - left, True, {"sold": 1, "left": left})
    rec.write("x", 9, False, {"sold": 1, "left": -1})  # refused: not counted
    assert checked(rec, invariant=stock(3)).ok
    assert checked(rec, invariant=stock(3, final=1)).invariant_errors == [
        "sold 3 + left 1 != initial 3"
    ]


def test_stock_going_negative_is_caught(rec: HistoryRecorder) -> None:
    rec.write("x", 1, True, {"sold": 1, "left": 0})
    rec.write("x", 2, True, {"sold": 1, "left": -1})
    errors = checked(rec, invariant=stock(1)).invariant_errors
    assert errors[0].startswith("stock went negative: -1 written with token 2")


def test_a_lost_update_breaks_sold_plus_left(rec: HistoryRecorder) -> None:
    rec.write("x", 1, True, {"sold": 1, "left": 9})  # both read 10, both wrote 9
    rec.write("x", 1, True, {"sold": 1, "left": 9})
    report = checked(rec, invariant=stock(10))
    assert report.invariant_errors == ["sold 2 + left 9 != initial 10"]
    with pytest.raises(AssertionError, match="sold 2"):
        report.raise_if_bad()


def test_an_unknown_outcome_counts_as_held_until_its_ttl(rec: HistoryRecorder) -> None:
    a = rec.invoke("x")
    rec.unknown(a, ttl=0.2)
    b = rec.invoke("x")
    rec.granted(b, 2)  # within the 0.2 s the lease of a may have had
    rec.released(b)
    report = checked(rec)
    assert [[h.unknown for h in o.holds] for o in report.overlaps] == [[True, False]]
    assert "unknown-outcome acquire" in str(report)
    time.sleep(0.25)
    c = rec.invoke("x")
    rec.granted(c, 3)
    rec.released(c)
    assert len(checked(rec).overlaps) == 1  # c came after: no new overlap


def _acquire_unknown(path: str) -> None:
    recorder = HistoryRecorder(path)
    recorder.unknown(recorder.invoke("x"), ttl=None)  # a lock that does not expire
    os._exit(0)


def test_an_unknown_outcome_without_ttl_is_held_until_its_process_ended(
    rec: HistoryRecorder,
) -> None:
    child = FORK.Process(target=_acquire_unknown, args=(rec.path,))
    child.start()
    child.join(10)
    b = rec.invoke("x")
    rec.granted(b, 2)
    rec.released(b)
    assert len(checked(rec).overlaps) == 1  # held until the end of the history
    events = load(rec.path)
    rec.ended(child.pid)  # as if recorded by the parent when it killed the child, before b:
    events.insert(2, {**load(rec.path)[-1], "t": events[1]["t"] + 1})
    assert check(events).ok


def test_holds_after_a_loss_notice_are_allowed_but_fencing_still_checked(
    rec: HistoryRecorder,
) -> None:
    paused, newer = rec.invoke("x"), rec.invoke("x")
    rec.granted(paused, 1)
    rec.lost(paused)  # the lease ended while its holder was paused
    rec.granted(newer, 2)
    rec.write("x", 2, True)
    rec.released(newer)
    rec.write("x", 1, False)  # the paused holder wakes: its stale write is refused
    rec.released(paused)
    report = checked(rec)
    assert report.ok and report.overlaps == []
    assert [[h.op for h in o.holds] for o in report.overlaps_after_loss] == [[paused.id, newer.id]]
    assert "1 overlaps after a loss notice: allowed" in str(report)
    rec.write("x", 1, True)  # but had storage accepted it, fencing is broken
    assert [(a.token, b.token) for a, b in checked(rec).backwards_writes] == [(2, 1)]


def test_a_lease_past_its_valid_until_is_no_longer_valid(rec: HistoryRecorder) -> None:
    paused, newer = rec.invoke("x"), rec.invoke("x")
    rec.granted(paused, 1, valid_until=time.monotonic() + 0.05)
    time.sleep(0.06)
    rec.granted(newer, 2)  # after the lease of paused ran out; no notice needed
    rec.released(newer)
    rec.released(paused)
    report = checked(rec)
    assert report.ok and len(report.overlaps_after_loss) == 1
    rec.renewed(paused, time.monotonic() + 30)  # renewed in time: the overlap counts
    assert len(checked(rec).overlaps) == 1


def test_load_reads_a_directory_and_names_a_bad_line(tmp_path: Path) -> None:
    HistoryRecorder(tmp_path / "a.jsonl").write("x", 1, True)
    HistoryRecorder(tmp_path / "b.jsonl").write("x", 2, True)
    assert [e["token"] for e in load(tmp_path)] == [1, 2]
    (tmp_path / "c.jsonl").write_text('{"t": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2: not a history event"):
        load(tmp_path)
    with pytest.raises(ValueError, match="semaphore needs a limit"):
        HistoryRecorder(tmp_path / "d.jsonl").invoke("x", "semaphore")


def _write_many(path: str, count: int) -> None:
    recorder = HistoryRecorder(path)
    for i in range(count):
        recorder.write("x", i, True, "v" * 5000)
    os._exit(0)


def test_lines_of_many_processes_never_interleave(rec: HistoryRecorder) -> None:
    rec.write("x", 0, True)  # opened in the parent: each child opens its own
    procs = [FORK.Process(target=_write_many, args=(rec.path, 200)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
    lines = Path(rec.path).read_text().splitlines()
    assert len(lines) == 801 and all(json.loads(line) for line in lines)
    assert len({json.loads(line)["pid"] for line in lines}) == 5


@LIBRARY_DB
def test_hold_records_a_grant_a_miss_and_an_error(rec: HistoryRecorder, unique) -> None:
    name = unique("hold")
    with rec.hold(locks["locmem"].lock(name)) as lease:

        def miss() -> None:
            with pytest.raises(LockTimeout), rec.hold(locks["locmem"].lock(name, timeout=0.01)):
                pass

        in_thread(miss)
        token = lease.fencing_token
    with pytest.raises(KeyError), rec.hold(locks["locmem"].lock(name)):
        raise KeyError("in the body")
    events = load(rec.path)
    assert [e["ev"] for e in events] == [
        "invoke", "granted", "invoke", "failed", "released", "invoke", "granted", "released",
    ]
    assert events[1]["token"] == token and events[1]["until"] > events[1]["t"]
    assert events[3]["error"].startswith("LockTimeout(") and events[5]["kind"] == "exclusive"
    assert checked(rec).ok


@LIBRARY_DB
def test_hold_records_a_lease_that_ran_out_as_lost_when_it_ended(
    rec: HistoryRecorder, unique
) -> None:
    with pytest.raises(LockLost), rec.hold(locks["locmem"].lock(unique("short"), ttl=0.05)):
        time.sleep(0.1)
    granted, lost, released = load(rec.path)[1:]
    assert (lost["ev"], released["ev"]) == ("lost", "released")
    assert lost["at"] == granted["until"] < lost["t"]


@LIBRARY_DB
def test_ahold_records_the_task(rec: HistoryRecorder, unique) -> None:
    async def main() -> None:
        async with rec.ahold(locks["locmem"].lock(unique("async"))):
            pass

    asyncio.run(main())
    events = load(rec.path)
    assert [e["ev"] for e in events] == ["invoke", "granted", "released"]
    assert all(e["task"] for e in events) and checked(rec).ok


def test_hold_records_an_unknown_outcome_when_the_server_fails(rec: HistoryRecorder) -> None:
    backend = RedisBackend("gone", {"LOCATION": "redis://127.0.0.1:1/0?socket_connect_timeout=1"})
    with pytest.raises(BackendUnavailable), rec.hold(backend.lock("x", ttl=7)):
        pass
    unknown = load(rec.path)[-1]
    assert (unknown["ev"], unknown["ttl"]) == ("unknown", 7_000_000_000)


# -- real runs: forked workers sell stock under a lock ---------------------------------


def _seller(path: str, alias: str, name: str, pk: int, rounds: int, start: Any) -> None:
    recorder = HistoryRecorder(path)
    start.wait()
    for _ in range(rounds):
        with recorder.hold(locks[alias].lock(name, ttl=30, timeout=60)) as lease:
            item = FencedItem.objects.get(pk=pk)
            time.sleep(0.002)
            if item.stock > 0:
                item.stock -= 1
                began, accepted = time.monotonic_ns(), True
                try:
                    item.fenced_save(lease, update_fields=["stock"])
                except StaleFencingToken:
                    accepted = False
                value = {"sold": 1, "left": item.stock}
                recorder.write(name, lease.fencing_token, accepted, value, began=began)
    done()


def _sell(tmp_path: Path, alias: str, name: str, initial: int) -> HistoryReport:
    item = FencedItem.objects.create(stock=initial)
    fork_ready()
    start = FORK.Event()
    procs = [
        FORK.Process(target=_seller, args=(tmp_path / "h.jsonl", alias, name, item.pk, 8, start))
        for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0] * 4
    item.refresh_from_db()
    return check(load(tmp_path), invariant=stock(initial, final=item.stock))


@LIBRARY_DB
def test_a_process_local_lock_across_processes_fails_the_check(tmp_path: Path, unique) -> None:
    report = _sell(tmp_path, "locmem", unique("sale"), initial=25)
    assert report.holds == 32 and report.processes == 4
    assert report.overlaps and report.repeated_tokens
    print(report)
    with pytest.raises(AssertionError, match="overlap on"):
        report.raise_if_bad()


@LIBRARY_DB
@pytest.mark.parametrize("alias", ["sqlite-lease", "pg-lease", "redis"])
def test_a_shared_lock_across_processes_passes_the_check(
    tmp_path: Path, alias: str, unique
) -> None:
    if needs_pg(alias):
        require_pg()
    if alias == "redis":
        require_redis()
    report = _sell(tmp_path, alias, unique("sale"), initial=25)
    report.raise_if_bad()
    assert (report.holds, report.processes, report.writes) == (32, 4, 25)


def _paused_holder(path: str, alias: str, name: str, pk: int, ready: Any, resumed: Any) -> None:
    recorder = HistoryRecorder(path)
    with pytest.raises(LockLost), recorder.hold(locks[alias].lock(name, ttl=1)) as lease:
        item = FencedItem.objects.get(pk=pk)
        ready.set()
        while not resumed.is_set():  # SIGSTOPped in here, past the lease
            time.sleep(0.01)
        item.stock -= 1
        began, accepted = time.monotonic_ns(), True
        try:  # the token as an int: the storage, not the handle, must refuse it
            item.fenced_save(lease.fencing_token, update_fields=["stock"])
        except StaleFencingToken:
            accepted = False
        value = {"sold": 1, "left": item.stock}
        recorder.write(name, lease.fencing_token, accepted, value, began=began)
    done()
    os._exit(0)


@LIBRARY_DB
@pytest.mark.parametrize("alias", ["sqlite-lease", "redis"])
def test_a_paused_holder_overlaps_legitimately_and_fencing_and_stock_still_pass(
    tmp_path: Path, alias: str, unique
) -> None:
    """A holder SIGSTOPped past its 1 s lease: the next holder's hold overlaps its claimed
    hold (allowed, reported apart), its stale write is refused, and stock adds up."""
    if alias == "redis":
        require_redis()
    name, item, path = unique("paused"), FencedItem.objects.create(stock=10), tmp_path / "h.jsonl"
    fork_ready()
    ready, resumed = FORK.Event(), FORK.Event()
    paused = FORK.Process(target=_paused_holder, args=(path, alias, name, item.pk, ready, resumed))
    paused.start()
    try:
        assert ready.wait(30)
        os.kill(paused.pid, signal.SIGSTOP)
        rec = HistoryRecorder(path)
        with rec.hold(locks[alias].lock(name, ttl=30, timeout=10)) as lease:
            item.refresh_from_db()
            item.stock -= 1
            began = time.monotonic_ns()
            item.fenced_save(lease, update_fields=["stock"])
            rec.write(name, lease.fencing_token, True, {"sold": 1, "left": 9}, began=began)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        resumed.set()
        paused.join(30)
    assert paused.exitcode == 0
    item.refresh_from_db()
    report = check(load(path), invariant=stock(10, final=item.stock))
    report.raise_if_bad()
    assert report.overlaps == [] and len(report.overlaps_after_loss) == 1
    assert [e["accepted"] for e in load(path) if e["ev"] == "write"] == [True, False]
