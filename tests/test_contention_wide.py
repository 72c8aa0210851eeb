"""Contention (issue 22): 100 OS processes released at once on one name; a non-blocking
round has exactly one winner.

The processes are forked from this warmed process (everything imported; connections
closed first, so none is shared), each opens its connection (``is_locked()``) and
blocks reading a pipe; the parent closes the pipe's write end once all are ready, and
every reader wakes at the same moment (EOF). Each tries ``acquire(blocking=False)``
once and writes its answer back; the winner holds until every answer is in. Bounded:
one round per backend, each process at most 30 s. ``DISTLOCK_SOAK=1`` runs 300.
"""

from __future__ import annotations

import os
import selectors
import time

import psycopg
import pytest
from django.db import connections

from django_distlock import locks

from .conftest import LIBRARY_DB, eventually, psycopg_params, require_memcached
from .figures import record
from .histories import done, fork_ready
from .test_hostile import require

pytestmark = LIBRARY_DB

PROCESSES = 300 if os.environ.get("DISTLOCK_SOAK") == "1" else 100
ALIASES = ["pg-lease", "pg-tx", "sqlite-lease", "redis", "redis-cluster", "redlock", "zk",
           "cache-memcached", "cache-redis"]
#: Where a round may also end with no winner, and why (never with two).
AT_MOST_ONE = {
    "redlock": "the masters' votes can split among contenders that each undo a minority "
    "grant: nobody wins that round (the algorithm's, docs/redlock.md)",
}


def _contender(alias: str, name: str, pipes: dict[str, int]) -> None:
    """A forked process' one try (never returns: ``os._exit``)."""
    status = 0
    try:
        for end in ("go_w", "done_w", "out_r"):
            os.close(pipes[end])
        backend = locks[alias]
        # Its connection opened before the barrier: the one its acquire uses. Transaction
        # mode's is Django's (is_locked() would open one of the backend's own sessions
        # instead, which the acquire never uses: two connections per contender, and a
        # round of 100 over the server's 200 once, in CI: "too many clients already").
        if getattr(backend, "mode", "") == "transaction":
            connections[backend.database].ensure_connection()
        else:
            backend.is_locked(name)
        handle = backend.lock(name, ttl=30)
        os.write(pipes["out_w"], b"R\n")
        os.read(pipes["go_r"], 1)  # EOF: the parent closed the write end, all wake
        began = time.monotonic_ns()
        won = handle.acquire(blocking=False)
        took = time.monotonic_ns() - began
        os.write(pipes["out_w"], f"{int(won)} {took} {handle.fencing_token}\n".encode())
        if won:
            os.read(pipes["done_r"], 1)  # held until every answer is in
            handle.release()
    except BaseException as exc:
        os.write(pipes["out_w"], f"E {exc!r}"[:400].replace("\n", " ").encode() + b"\n")
        status = 1
    finally:
        done()
        os._exit(status)


def _lines(fd: int, count: int, timeout: float, found: list[str]) -> None:
    """Read whole lines from ``fd`` into ``found`` until it has ``count`` more of them."""
    want, buffer, deadline = len(found) + count, b"", time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while len(found) < want:
            left = deadline - time.monotonic()
            assert left > 0 and selector.select(left), f"{want - len(found)} answers missing"
            chunk = os.read(fd, 65536)
            assert chunk, "every contender closed its pipe before answering"
            buffer += chunk
            *whole, buffer = buffer.split(b"\n")
            found += [line.decode() for line in whole]


def contend(alias: str, name: str, processes: int) -> list[str]:
    """Fork ``processes`` contenders for ``name``, release them at once, and return each
    one's answer line (``"won took_ns token"`` or ``"E error"``)."""
    fork_ready()
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    out_r, out_w = os.pipe()
    pipes = {"go_r": go_r, "go_w": go_w, "done_r": done_r, "done_w": done_w,
             "out_r": out_r, "out_w": out_w}
    pids = []
    try:
        for _ in range(processes):
            pid = os.fork()
            if pid == 0:
                _contender(alias, name, pipes)
            pids.append(pid)
        for end in ("go_r", "done_r", "out_w"):
            os.close(pipes.pop(end))
        ready: list[str] = []
        _lines(out_r, processes, 60, ready)
        assert set(ready) == {"R"}, [line for line in ready if line != "R"]
        os.close(pipes.pop("go_w"))  # fire
        answers: list[str] = []
        _lines(out_r, processes, 30, answers)
        return answers
    finally:
        for fd in pipes.values():
            os.close(fd)  # done_w: the winner releases
        deadline = time.monotonic() + 30
        for pid in pids:
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                time.sleep(0.01)


@pytest.mark.parametrize("alias", ALIASES)
def test_a_non_blocking_round_of_100_processes_has_one_winner(alias: str, unique) -> None:
    if alias == "cache-memcached":
        require_memcached()
    else:
        require(alias)
    name = unique("contended")
    locks[alias].is_locked(name)  # warm: the imports and the backend built before forking
    processes = PROCESSES
    if alias.startswith("pg"):  # room for them under max_connections (200: scripts/servers.py)
        processes = min(PROCESSES, 150)
        assert eventually(lambda: _sessions(locks[alias].database) <= 190 - processes,
                          timeout=15), "the server's sessions are taken by others"
    began = time.monotonic()
    answers = contend(alias, name, processes)
    took = time.monotonic() - began
    errors = [line for line in answers if line.startswith("E")]
    assert errors == [], errors[:5]
    won = [line for line in answers if line.startswith("1")]
    assert len(won) <= 1, won
    if alias not in AT_MOST_ONE:
        assert len(won) == 1, f"no winner among {len(answers)}"
    worst = max(int(line.split()[1]) for line in answers) / 1e9
    assert worst < 10, worst  # a non-blocking call is back at once, even under this load
    assert not locks[alias].is_locked(name) or _freed_soon(alias, name)
    record("contention-100", alias, processes=processes, acquisitions=len(answers),
           winners=len(won), overlaps=max(0, len(won) - 1), worst_call_s=round(worst, 4),
           bound_s=10, round_s=round(took, 2))


def _sessions(database: str) -> int:
    """How many sessions the server has open (every database: they share its limit)."""
    with psycopg.connect(**psycopg_params(database), autocommit=True) as side:
        row = side.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                           "'client backend'").fetchone()
    return int(row[0]) if row else 0


def _freed_soon(alias: str, name: str) -> bool:
    deadline = time.monotonic() + 5
    while locks[alias].is_locked(name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_round_sees_two_winners_on_a_process_local_backend(unique) -> None:
    """The check can fail: locmem's lock table is each process' own, so all win."""
    answers = contend("locmem", unique("local"), 5)
    assert sum(line.startswith("1") for line in answers) == 5, answers
