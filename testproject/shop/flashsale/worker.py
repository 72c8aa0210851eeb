"""One flash-sale worker process: wait for the start signal, then buy until sold out."""

from __future__ import annotations

import os
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections

from django_distlock import locks
from django_distlock.exceptions import DistLockError, LockNotAcquired

from .strategies import Strategy

#: A worker gives up after this many failed attempts in a row.
MAX_CONSECUTIVE_ERRORS = 50
#: Pause after a failed attempt, so a failing server is not hammered.
ERROR_PAUSE = 0.01
BOUGHT, SOLD_OUT, LOCK_TIMEOUT, ERROR = "bought", "sold out", "lock timeout", "error"


@dataclass
class WorkerResult:
    """What a worker reports back to the parent when it ends."""

    name: str
    pid: int
    #: Attempts by outcome: bought, sold out, lock timeout, error.
    outcomes: Counter[str] = field(default_factory=Counter)
    #: Seconds each acquired lock was waited for (monotonic, around acquire()).
    lock_waits: list[float] = field(default_factory=list)
    #: The first few error messages.
    errors: list[str] = field(default_factory=list)
    #: Monotonic times of the start signal and of the worker's last attempt.
    started: float | None = None
    finished: float | None = None
    #: Why the worker stopped before the product sold out, if it did.
    fatal: str | None = None

    def record_failure(self, outcome: str, exc: BaseException) -> None:
        self.outcomes[outcome] += 1
        if len(self.errors) < 3:
            self.errors.append(f"{type(exc).__name__}: {exc}")


def run(
    index: int,
    strategy: Strategy,
    product_id: int,
    work: float,
    ready: Any,
    go: Any,
    sold: Any,
    results: Any,
) -> None:
    """Process entry point: connect, report ready, wait for ``go``, buy until sold out.

    Always puts one :class:`WorkerResult` on ``results``; the parent reads
    ``sold`` (a shared counter) for its progress line.
    """
    _setup_django()
    result = WorkerResult(f"worker-{index}", os.getpid())
    try:
        try:
            _connect(strategy)
        finally:
            ready.release()  # even on failure: the sale starts without this worker
        go.wait()
        result.started = time.monotonic()
        _buy_until_sold_out(strategy, product_id, work, sold, result)
    except BaseException as exc:  # report every failure, even ^C, to the parent
        result.fatal = "".join(traceback.format_exception_only(exc)).strip()
    finally:
        result.finished = time.monotonic()
        results.put(result)
        locks.close_all()
        connections.close_all()


def _setup_django() -> None:
    """Set Django up when the process was spawned rather than forked."""
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup()


def _connect(strategy: Strategy) -> None:
    """Open this process' own connections before the start, so the sale times no connect."""
    connections["default"].ensure_connection()
    if strategy.alias is not None:
        locks[strategy.alias].health()


def _buy_until_sold_out(
    strategy: Strategy, product_id: int, work: float, sold: Any, result: WorkerResult
) -> None:
    failures = 0
    while True:
        try:
            attempt = strategy.buy(product_id, worker=result.name, work=work)
        except LockNotAcquired as exc:
            result.record_failure(LOCK_TIMEOUT, exc)
            failures = _pause_or_give_up(failures + 1, exc)
            continue
        except (DatabaseError, DistLockError) as exc:
            result.record_failure(ERROR, exc)
            failures = _pause_or_give_up(failures + 1, exc)
            continue
        failures = 0
        if attempt.lock_wait is not None:
            result.lock_waits.append(attempt.lock_wait)
        if not attempt.bought:
            result.outcomes[SOLD_OUT] += 1
            return
        result.outcomes[BOUGHT] += 1
        with sold.get_lock():
            sold.value += 1


def _pause_or_give_up(failures: int, exc: BaseException) -> int:
    """Sleep a little after a failed attempt; raise once too many failed in a row."""
    if failures >= MAX_CONSECUTIVE_ERRORS:
        raise RuntimeError(f"gave up after {failures} failed attempts in a row: {exc}") from exc
    time.sleep(ERROR_PAUSE)
    return failures
