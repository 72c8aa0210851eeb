"""Recorded hold histories of forked processes: what the process and fault tests of
every backend check mutual exclusion with."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from typing import Any

from django.db import connections

from django_distlock import locks

FORK = multiprocessing.get_context("fork")


def fork_ready() -> None:
    """Leave nothing a child could share with the parent."""
    connections.close_all()
    locks.close_all()


def done() -> None:
    """A child's last step: close what it opened."""
    locks.close_all()
    connections.close_all()


def overlaps(history: list[tuple[int, ...]]) -> list[tuple[tuple[int, ...], ...]]:
    """Pairs of holds (``(began_ns, ended_ns, pid)``, sorted) that overlap in time."""
    return [(a, b) for a, b in itertools.pairwise(history) if b[0] < a[1]]


def _worker(alias: str | None, name: str, rounds: int, start: Any, out: Any) -> None:
    start.wait()
    held = []
    for _ in range(rounds):
        if alias is None:  # no lock: the check must see overlaps
            began = time.monotonic_ns()
            time.sleep(0.002)
            held.append((began, time.monotonic_ns(), os.getpid()))
            continue
        with locks[alias].lock(name, ttl=30, timeout=60):
            began = time.monotonic_ns()
            time.sleep(0.002)
            held.append((began, time.monotonic_ns(), os.getpid()))
    out.put(held)
    done()


def run_forked(target: Any, args: tuple[Any, ...], workers: int,
               timeout: float = 120) -> tuple[list[Any], list[int | None]]:
    """Fork ``workers`` processes running ``target(*args, start, out)``, release them at
    once (``start``), and collect one ``out.put()`` of each; return those results and
    the processes' exit codes (a process still running after 30 s is killed)."""
    fork_ready()
    start, out = FORK.Event(), FORK.Queue()
    procs = [FORK.Process(target=target, args=(*args, start, out)) for _ in range(workers)]
    for proc in procs:
        proc.start()
    start.set()
    try:
        results = [out.get(timeout=timeout) for _ in procs]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    return results, [proc.exitcode for proc in procs]


def history(alias: str | None, name: str, workers: int, rounds: int) -> list[tuple[int, ...]]:
    """The sorted holds of ``workers`` forked processes taking ``name`` on ``alias``
    ``rounds`` times each (2 ms holds); ``alias`` None takes no lock at all."""
    results, exitcodes = run_forked(_worker, (alias, name, rounds), workers, timeout=90)
    assert exitcodes == [0] * workers
    found = sorted(interval for held in results for interval in held)
    assert len(found) == workers * rounds
    return found
