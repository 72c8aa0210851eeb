"""Run one strategy: start the worker processes, release them at once, collect results."""

from __future__ import annotations

import multiprocessing
import queue
import time
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from django.db import connections

from django_distlock import locks

from . import worker
from .progress import Progress
from .strategies import Strategy
from .worker import WorkerResult

#: Longest wait for the workers to connect before the start signal.
STARTUP_TIMEOUT = 60.0
#: Longest wait for a worker that has reported to exit.
EXIT_TIMEOUT = 10.0


def _context() -> BaseContext:
    """Fork where the platform has it (fast, and the child inherits the set-up Django)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def run_strategy(
    strategy: Strategy,
    *,
    product_id: int,
    stock: int,
    workers: int,
    work: float,
    progress: Progress,
) -> list[WorkerResult]:
    """Run ``workers`` processes buying ``product_id`` with ``strategy`` until sold out.

    Returns one result per worker; a worker that died without reporting gets
    a result whose ``fatal`` says so.
    """
    ctx = _context()
    ready, go = ctx.Semaphore(0), ctx.Event()
    sold = ctx.Value("i", 0)
    results: multiprocessing.Queue[WorkerResult] = ctx.Queue()
    # Each child opens its own connections: none may be inherited.
    connections.close_all()
    locks.close_all()
    processes = [
        ctx.Process(  # type: ignore[attr-defined]
            target=worker.run,
            args=(index, strategy, product_id, work, ready, go, sold, results),
            name=f"flashsale-{index}",
            daemon=True,
        )
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    collected: list[WorkerResult] = []
    try:
        _wait_ready(ready, processes)
        go.set()  # every worker starts buying at the same moment
        started = time.monotonic()
        while len(collected) < workers:
            try:
                collected.append(results.get(timeout=0.05))
            except queue.Empty:
                if not any(process.is_alive() for process in processes):
                    _drain(results, collected)
                    break
            progress.update(strategy.short, sold.value, stock, time.monotonic() - started)
        progress.finish(strategy.short, sold.value, stock, time.monotonic() - started)
        for process in processes:
            process.join(EXIT_TIMEOUT)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join()
    return collected + _missing(processes, collected)


def _wait_ready(ready: Any, processes: list[BaseProcess]) -> None:
    """Wait until every worker has connected (or died trying)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    waiting = len(processes)
    while waiting:
        if ready.acquire(timeout=0.1):
            waiting -= 1
        elif time.monotonic() > deadline:
            raise RuntimeError(f"{waiting} flash-sale workers did not start in time.")
        elif not any(process.is_alive() for process in processes):
            return


def _drain(results: multiprocessing.Queue[WorkerResult], collected: list[WorkerResult]) -> None:
    """Collect the results still in the queue after every worker has exited."""
    while True:
        try:
            collected.append(results.get(timeout=0.5))
        except queue.Empty:
            return


def _missing(processes: list[BaseProcess], collected: list[WorkerResult]) -> list[WorkerResult]:
    reported = {result.pid for result in collected}
    return [
        WorkerResult(
            process.name,
            process.pid or 0,
            fatal=f"exited with code {process.exitcode} without reporting",
        )
        for process in processes
        if process.pid not in reported
    ]
