"""Deadlocks the database detects are typed: two threads each holding one name and
waiting for the other's, in transaction mode (PostgreSQL's 40P01, InnoDB's 1213) and in
MySQL's lease mode (MariaDB's named locks, 1213): one wait is refused with ``Deadlock``
(a ``LockNotAcquired``, chained to the server's error), the other goes on and gets both.

InnoDB rolls the refused thread's whole transaction back, and its outer lock with it:
that hold is marked lost at once (before the other thread is granted it), and its
release raises ``LockLost``. PostgreSQL rolls back to the wait's savepoint only: the
outer lock stays held. PostgreSQL's lease mode holds no server lock between calls, so
no cycle is seen: both waits end at their timeouts (the lock-order checker's job).
Session mode's deadlocks: tests/test_backend_database_session.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connections

from django_distlock import locks
from django_distlock.exceptions import Deadlock, LockLost, LockTimeout
from django_distlock.testing.signals import signals_sent

from .conftest import LIBRARY_DB, require_alias

pytestmark = LIBRARY_DB


def _crossed(alias: str, name: str, timeout: float,
             both_waits_end_first: bool = False) -> dict[str, dict[str, Any]]:
    """Thread "a" holds ``name``+a and waits for ``name``+b; thread "b" the reverse.
    ``both_waits_end_first``: neither releases its outer lock before both waits ended
    (where no cycle is detected, the first wait to time out would otherwise release the
    lock the other still waits for, and that wait would be granted)."""
    met = threading.Barrier(2)
    ended = threading.Barrier(2) if both_waits_end_first else None
    seen: dict[str, dict[str, Any]] = {}

    def worker(tag: str, first: str, second: str) -> None:
        report: dict[str, Any] = seen.setdefault(tag, {})
        outer = locks[alias].lock(first, timeout=10)
        try:
            outer.acquire()
            met.wait(10)
            inner = locks[alias].lock(second, timeout=timeout)
            try:
                with inner:
                    report["inner"] = "held"
            except (Deadlock, LockTimeout) as exc:
                report["inner"] = exc
                report["outer lost at once"] = outer.lost
            if ended is not None:
                ended.wait(10)
            try:
                outer.release()
                report["outer"] = "released"
            except LockLost as exc:
                report["outer"] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=("a", name + "a", name + "b")),
               threading.Thread(target=worker, args=("b", name + "b", name + "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return seen


@pytest.mark.parametrize("alias", ["pg-tx", "mysql-tx", "mysql-lease"])
def test_crossed_waits_refuse_one_wait_as_a_deadlock(alias: str, unique) -> None:
    require_alias(alias)
    name = unique("crossed")
    with signals_sent("lock_acquire_failed", "lock_not_acquired") as sent:
        seen = _crossed(alias, name, timeout=20)
    refused = [tag for tag, report in seen.items() if isinstance(report["inner"], Deadlock)]
    assert len(refused) == 1, seen
    # The refused wait is an acquire that raised: one lock_acquire_failed, of its name.
    assert sent == [("lock_acquire_failed", name + ("b" if refused == ["a"] else "a"))]
    loser, winner = seen[refused[0]], seen["b" if refused == ["a"] else "a"]
    error = loser["inner"]
    assert error.alias == alias and error.__cause__ is not None
    assert "would deadlock" in str(error)
    assert winner["inner"] == "held" and winner["outer"] == "released"
    if alias == "mysql-tx":  # the whole transaction was rolled back, the outer lock too
        assert loser["outer lost at once"] is True
        assert isinstance(loser["outer"], LockLost)
    else:
        assert loser["outer lost at once"] is False and loser["outer"] == "released"


def test_postgresql_lease_mode_sees_no_cycle_and_both_waits_time_out(unique) -> None:
    require_alias("pg-lease")
    started = time.monotonic()
    # Both 1 s waits start within moments of each other: the one that ended first let go
    # of its outer lock, and the other, still waiting, was granted it (CI, once).
    seen = _crossed("pg-lease", unique("lease-cycle"), timeout=1, both_waits_end_first=True)
    assert all(isinstance(report["inner"], LockTimeout) for report in seen.values()), seen
    assert all(report["outer"] == "released" for report in seen.values()), seen
    assert time.monotonic() - started < 10
