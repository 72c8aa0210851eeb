"""What the kinds' fault scenarios share (tests/test_hostile_kinds*.py): which aliases
offer which kinds, the handle each kind takes, and the figures a recorded history gives
for tests/figures.py."""

from __future__ import annotations

import random
from typing import Any

from django_distlock.backends.base import BaseLockBackend
from django_distlock.testing.history import HistoryReport

from .figures import record

LIMIT = 3  # the semaphores' limit
KINDS = ["read", "write", "semaphore"]

#: The aliases of tests/test_hostile.py that offer no kind but exclusive, and why (a test
#: checks this against the backends' flags, so a kind gained is not left untested).
NO_KINDS = {
    "sqlite-tx": "the lock is SQLite's single write lock (docs/kinds.md, reason 4)",
    "pg-tx": "a row lock of one connection: no read side, no count (docs/kinds.md, 8 and 12)",
    "mysql-tx": "a row lock of one connection, as pg-tx: no read side, no count",
    "pg-session": "one advisory lock of one session per name: read-write locks not built "
    "yet, no count (docs/kinds.md)",
    "mysql-session": "one named lock of one session per name: MySQL's named locks have no "
    "shared mode, no count (docs/kinds.md)",
    "locmem": "process-local; no kinds (docs/kinds.md, 11 and 15)",
    "redlock": "a count or a read side on independent masters could disagree (9 and 13)",
    "cache-memcached": "`add` takes one key: no read side, no count that eviction cannot "
    "lose (docs/kinds.md)",
    "cache-redis": "`add` takes one key: no read side, no count that eviction cannot lose "
    "(docs/kinds.md)",
}
#: The aliases with kinds that are another alias' code on the same server: the mixed run
#: and the cancelled acquires run on the first, not on these.
SAME_AS = {
    "default": "sqlite-lease's backend with another KEY_PREFIX",
    "redis-cache": "the 'redis' kind scripts through django-redis' client",
    "redis-djcache": "the 'redis' kind scripts through Django's RedisCache client",
    "redis-decoded": "the 'redis' kind scripts, replies decoded",
    "zk-auth": "'zk' with an ACL: the recipes are the same",
}
KIND_ALIASES = ["sqlite-lease", "pg-lease", "mysql-lease", "redis", "redis-unfair", "redis-cluster",
                "zk"]


def kinds_offered(backend: BaseLockBackend) -> list[str]:
    """The kinds besides exclusive that ``backend``'s flags say it offers."""
    return (["read", "write"] if backend.supports_read_write else []) + (
        ["semaphore"] if backend.supports_semaphore else [])


def of_kind(backend: BaseLockBackend, kind: str, name: str, **options: Any) -> Any:
    """A handle of ``kind`` on ``name`` (a semaphore of LIMIT permits)."""
    if kind == "semaphore":
        return backend.semaphore(name, LIMIT, **options)
    return getattr(backend, f"{kind}_lock")(name, **options)


#: The kind that waits while a holder of the key's kind holds (a semaphore: its LIMIT
#: permits all held).
BLOCKED_BY = {"read": "write", "write": "read", "semaphore": "semaphore"}


def hold_all(backend: BaseLockBackend, kind: str, name: str, **options: Any) -> list[Any]:
    """Take what keeps a waiter of ``kind`` out of ``name`` (each handle acquired)."""
    blocker = BLOCKED_BY[kind]
    handles = [of_kind(backend, blocker, name, **options)
               for _ in range(LIMIT if kind == "semaphore" else 1)]
    for i, handle in enumerate(handles):
        if not handle.acquire(blocking=False):
            for got in handles[:i]:
                got.release()
            raise AssertionError(f"{blocker} of {name} not free")
    return handles


def free_for_all(backend: BaseLockBackend, kind: str, name: str) -> bool:
    """Whether nothing of ``name`` is held: a write lock (read/write), LIMIT permits
    (semaphore) taken at once, and given back."""
    taker = kind if kind == "semaphore" else "write"
    handles = [of_kind(backend, taker, name, ttl=30)
               for _ in range(LIMIT if kind == "semaphore" else 1)]
    got = [handle for handle in handles if handle.acquire(blocking=False)]
    for handle in got:
        handle.release()
    return len(got) == len(handles)


def mixed(backend: BaseLockBackend, name: str, **options: Any) -> Any:
    """A mixed run's handle: a reader (half), a writer (a quarter) on ``name``, or a
    permit of ``name/sem`` (a quarter; a semaphore and a read-write lock are two
    names, a backend refuses one name used as both)."""
    roll = random.random()
    if roll < 0.25 and backend.supports_semaphore:
        return backend.semaphore(f"{name}/sem", LIMIT, **options)
    return of_kind(backend, "read" if roll < 0.65 else "write", name, **options)


def worst_call_s(events: list[dict[str, Any]]) -> float:
    """The longest acquire call of a history (invoke to grant or failure), in seconds."""
    began = {e["op"]: e["t"] for e in events if e["ev"] == "invoke"}
    ends = [e["t"] - began[e["op"]] for e in events
            if e["ev"] in ("granted", "failed", "unknown") and e.get("op") in began]
    return round(max(ends, default=0) / 1e9, 4)


def record_history(scenario: str, backend: str, report: HistoryReport,
                   events: list[dict[str, Any]], **figures: Any) -> None:
    """:func:`tests.figures.record` with the counts of a checked history."""
    record(scenario, backend, processes=report.processes, acquisitions=report.holds,
           overlaps=len(report.overlaps), repeated_tokens=len(report.repeated_tokens),
           stale_writes_accepted=len(report.backwards_writes),
           worst_call_s=worst_call_s(events), **figures)
