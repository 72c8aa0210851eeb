"""The contract on PostgreSQL's lease mode, whose statements run on the backend's own
psycopg sessions (Django only opens their connections): decided by PostgreSQL and our
routines, so it runs in one env (CONTRIBUTING.md, "The tiers"). The other database
modes: ``test_backend_database.py``."""

from __future__ import annotations

import time

import pytest

from django_distlock.backends.database.sessions import Watchdog
from django_distlock.testing import LockContract

from .conftest import LIBRARY_DB, eventually, require_pg

pytestmark = [pytest.mark.second_env, LIBRARY_DB]


class TestPostgresLease(LockContract):
    alias = "pg-lease"

    @pytest.fixture(autouse=True)
    def _pg(self) -> None:
        require_pg()


class _Cuttable:
    """What the watchdog needs of a session: ``until``, ``timed_out`` and ``cut()``,
    recorded."""

    def __init__(self) -> None:
        self.until: float | None = None
        self.timed_out = False
        self.cut_at: float | None = None

    def cut(self) -> None:
        self.timed_out = True
        self.cut_at = time.monotonic()


def test_the_watchdog_outlives_a_call_watched_until_a_huge_deadline() -> None:
    """A call with ``timeout=1e308`` (its deadline past what a thread may sleep) must not
    end the watchdog's thread: a later call past its deadline is still cut. (The thread
    died of ``OverflowError`` in its sleep, and no call of the process was cut again: a
    frozen server then held releases until it thawed.)"""
    watchdog = Watchdog()
    far, late = _Cuttable(), _Cuttable()
    far.until = time.monotonic() + 1e308
    watchdog.add(far)  # type: ignore[arg-type]
    time.sleep(0.2)  # the thread looks at it, and sleeps
    late.until = time.monotonic()
    watchdog.add(late)  # type: ignore[arg-type]
    assert eventually(lambda: late.cut_at is not None, 5)
    assert far.cut_at is None


def test_the_watchdog_cuts_only_a_call_past_its_bound() -> None:
    """A session whose call returned (``until`` cleared) is never cut, however old its
    bound was; one whose call runs past its bound is, once, and a session added later
    is looked after too."""
    watchdog = Watchdog()
    done, idle, running = _Cuttable(), _Cuttable(), _Cuttable()
    for session in (done, idle, running):
        watchdog.add(session)  # type: ignore[arg-type]
    done.until = time.monotonic() + 0.1
    done.until = None  # returned in time
    running.until = time.monotonic() + 0.1
    assert eventually(lambda: running.cut_at is not None, 5)
    first = running.cut_at
    time.sleep(0.6)  # two ticks more: cut once
    assert running.cut_at == first
    assert done.cut_at is None and idle.cut_at is None
    added = _Cuttable()
    added.until = time.monotonic()
    watchdog.add(added)  # type: ignore[arg-type]
    assert eventually(lambda: added.cut_at is not None, 5)
