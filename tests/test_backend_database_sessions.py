"""The contract on PostgreSQL's lease mode, whose statements run on the backend's own
psycopg sessions (Django only opens their connections): decided by PostgreSQL and our
routines, so it runs in one env (CONTRIBUTING.md, "The tiers"). The other database
modes: ``test_backend_database.py``."""

from __future__ import annotations

import time

import pytest

from django_distlock.backends.database.sessions import WATCHDOG_GRACE, Watchdog
from django_distlock.testing import LockContract

from .conftest import LIBRARY_DB, eventually, require_pg

pytestmark = [pytest.mark.second_env, LIBRARY_DB]


class TestPostgresLease(LockContract):
    alias = "pg-lease"

    @pytest.fixture(autouse=True)
    def _pg(self) -> None:
        require_pg()


class _Cuttable:
    """What the watchdog needs of a session: ``cut()``, recorded."""

    def __init__(self) -> None:
        self.cut_at: float | None = None

    def cut(self) -> None:
        self.cut_at = time.monotonic()


def test_the_watchdog_outlives_a_call_watched_until_a_huge_deadline() -> None:
    """A call with ``timeout=1e308`` (its deadline past what a thread may sleep) must not
    end the watchdog's thread: a later call past its deadline is still cut. (The thread
    died of ``OverflowError`` in its sleep, and no call of the process was cut again: a
    frozen server then held releases until it thawed.)"""
    watchdog = Watchdog()
    far, late = _Cuttable(), _Cuttable()
    watchdog.watch(far, time.monotonic() + 1e308)  # type: ignore[arg-type]
    time.sleep(0.2)  # the thread looks at it, and sleeps
    watchdog.watch(late, time.monotonic() - WATCHDOG_GRACE)  # type: ignore[arg-type]
    assert eventually(lambda: late.cut_at is not None, 5)
    assert far.cut_at is None
