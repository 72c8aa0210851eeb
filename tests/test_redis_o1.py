"""The Redis scripts stay O(1) with 1,000,000 keys present (issue 22).

A private ``redis-server`` is measured twice with Redis' own accounting (``INFO
commandstats``: server time per call, and the commands a script runs): almost empty,
then filled with 1,000,000 other keys (``DEBUG POPULATE``) and 10,000 held locks. The
acquire, extend and release scripts, and a listing's first page, must cost about the
same server time per call (a ratio, not a wall-clock figure), and a page must run the
same number of commands.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import redis

from django_distlock.backends.redis import RedisBackend

from .conftest import require_redis
from .figures import record
from .private_redis import Server

CALLS = 200  # per measured round
ROUNDS = 3  # the cheapest round counts: a round the OS preempted is not the script's cost
PAGE = 50
BOUND = 3.0  # full / almost empty, per call
FILLER, HELD = 1_000_000, 10_000


def _stats(admin: redis.Redis) -> dict[str, tuple[int, int]]:
    """``{command: (calls, usec)}`` since the last ``CONFIG RESETSTAT``."""
    found = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): (row["calls"], row["usec"])
            for name, row in found.items()}


def _measure(admin: redis.Redis, run: Any, undo: Any = None) -> tuple[float, float]:
    """Server µs per script call of ``run`` (CALLS calls), the cheapest of ROUNDS, and the
    commands its scripts ran per call; ``undo`` (not measured) runs after each round."""
    best, commands = float("inf"), 0.0
    for _ in range(ROUNDS):
        admin.config_resetstat()
        run()
        stats = _stats(admin)
        if undo is not None:
            undo()
        calls, usec = stats.get("evalsha", (0, 0))
        assert calls >= CALLS, stats
        best = min(best, usec / calls)
        inner = sum(c for name, (c, _) in stats.items() if name not in OUTSIDE)
        commands = inner / calls
    return best, commands


#: Commands of the measurement itself, not run by the scripts.
OUTSIDE = {"evalsha", "eval", "config|resetstat", "info", "script|load"}


def _costs(backend: RedisBackend, admin: redis.Redis) -> dict[str, tuple[float, float]]:
    """Per script: (server µs per call, commands per call)."""
    handles = [backend.lock(f"{secrets.token_hex(4)}:{i}", ttl=60) for i in range(CALLS)]

    def acquire() -> None:
        for handle in handles:
            assert handle.acquire(blocking=False)

    def extend() -> None:
        for handle in handles:
            handle.extend(60)

    def release() -> None:
        for handle in handles:
            handle.release()

    def listing() -> None:
        for _ in range(CALLS):
            assert len(backend.held_locks(limit=PAGE).locks) == PAGE

    costs = {"acquire": _measure(admin, acquire, release)}
    acquire()
    costs["extend"] = _measure(admin, extend)
    costs["release"] = _measure(admin, release, acquire)
    costs["listing"] = _measure(admin, listing)
    release()
    return costs


def test_scripts_cost_the_same_with_a_million_keys(tmp_path: Path) -> None:
    require_redis()
    server = Server(tmp_path, ("--enable-debug-command", "yes"))
    server.start()
    backend = RedisBackend("o1", {"LOCATION": server.url(), "TTL": 60})
    admin = redis.Redis(port=server.port)
    try:
        for i in range(PAGE + 10):  # a first page to list
            assert backend.lock(f"held:{i}", ttl=600).acquire(blocking=False)
        empty = _costs(backend, admin)
        admin.execute_command("DEBUG", "POPULATE", FILLER, "filler")
        for start in range(PAGE + 10, HELD, 1000):  # ~10,000 held locks, through the backend
            for i in range(start, min(start + 1000, HELD)):
                assert backend.lock(f"held:{i}", ttl=600).acquire(blocking=False)
        assert admin.dbsize() >= FILLER + HELD
        full = _costs(backend, admin)
    finally:
        admin.close()
        backend.close()
        server.kill()
    for op in empty:
        (e_usec, e_cmds), (f_usec, f_cmds) = empty[op], full[op]
        ratio = f_usec / e_usec
        record("o1-million", f"redis ({op})", keys=FILLER, held=HELD,
               empty_usec=round(e_usec, 1), full_usec=round(f_usec, 1),
               ratio=round(ratio, 2), bound_ratio=BOUND, commands_per_call=round(f_cmds, 1))
        assert ratio < BOUND, (op, empty[op], full[op])
        assert f_cmds == e_cmds, (op, e_cmds, f_cmds)
