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


def history(alias: str | None, name: str, workers: int, rounds: int) -> list[tuple[int, ...]]:
    """The sorted holds of ``workers`` forked processes taking ``name`` on ``alias``
    ``rounds`` times each (2 ms holds); ``alias`` None takes no lock at all."""
    fork_ready()
    start, out = FORK.Event(), FORK.Queue()
    procs = [
        FORK.Process(target=_worker, args=(alias, name, rounds, start, out)) for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    start.set()
    try:
        found = [interval for _ in procs for interval in out.get(timeout=90)]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    assert [proc.exitcode for proc in procs] == [0] * workers
    found.sort()
    assert len(found) == workers * rounds
    return found
