"""tests/test_hostile.py's server scenarios on read-write locks and semaphores (issue 22).

4. the server restarted from its saved state (Redis' AOF or an older snapshot, every
   PostgreSQL session of the test database ended, ZooKeeper from its data dir) while a
   writer, a reader and all of a semaphore's permits are held: no newcomer is granted
   while they still hold; a writer's token after the restart exceeds every one before;
5. a waiter's entry (Redis queue member, ZooKeeper node or gate node, PostgreSQL
   writer's intent) deleted under it: the waiter is never granted beside a newcomer
   that excludes it, it is granted or times out cleanly, the name ends free.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from django.db import connections

from django_distlock import locks
from django_distlock.exceptions import BackendUnavailable, LockLost, LockNotAcquired
from django_distlock.testing.history import HistoryRecorder, check, load

from .conftest import (
    LIBRARY_DB,
    eventually,
    in_thread,
    mysql_side,
    psycopg_params,
    require_mysql,
    require_pg,
    require_redis,
)
from .figures import record
from .kinds_catalogue import (
    BLOCKED_BY,
    KIND_ALIASES,
    KINDS,
    LIMIT,
    free_for_all,
    hold_all,
    of_kind,
    record_history,
)
from .private_redis import Server
from .test_hostile import (  # noqa: F401  (the zookeeper fixture)
    ZooKeeper,
    _acquire_retrying,
    _kill_all_mysql,
    _release_retrying,
    _terminate_all,
    private_backend,
    require,
    zookeeper,
)

pytestmark = LIBRARY_DB


# -- 4. the server restarted while every kind is held ------------------------------------

#: The kinds' aliases whose server is not restarted here, and why.
NO_RESTART = {
    "sqlite-lease": "SQLite is a file: nothing to restart",
    "redis-unfair": "the 'redis' kind scripts (without the queue): 'redis' is restarted",
    "redis-cluster": "a private cluster is beyond this module's budget",
}
RESTARTS = ["redis-aof", "redis-snapshot", "pg-lease", "mysql-lease", "zk"]


def test_every_kinds_alias_is_restarted_or_left_with_a_reason() -> None:
    taken = {v.rsplit("-", 1)[0] if v.startswith("redis") else v for v in RESTARTS}
    assert taken | set(NO_RESTART) == set(KIND_ALIASES)


def _write_tokens(backend: Any, name: str, grants: int) -> list[int]:
    tokens = []
    for _ in range(grants):
        with of_kind(backend, "write", name, ttl=30) as handle:
            tokens.append(handle.fencing_token)
    return tokens


def _restart_while_held(backend: Any, other: Any, base: str, restart: Callable[[], None],
                        saved: Callable[[], None] | None = None) -> dict[str, Any]:
    """Hold what keeps each kind out of ``base/<kind>`` on ``backend`` (``saved()`` runs
    after three writes, before the holds: a snapshot), ``restart()``, then check a
    newcomer of each kind on ``other``; its figures. Without ``saved``, the holds must
    survive the restart; with it, their releases report the loss."""
    tokens = _write_tokens(backend, f"{base}/read", 3)
    if saved is not None:
        saved()
        tokens += _write_tokens(backend, f"{base}/read", 3)  # not in the snapshot
    held = {kind: hold_all(backend, kind, f"{base}/{kind}", ttl=30) for kind in KINDS}
    issued = {f"{base}/read": tokens}  # every token issued on each name (a name's own counter)
    for kind, handles in held.items():
        issued.setdefault(f"{base}/{kind}", []).extend(
            h.fencing_token for h in handles if h.fencing_token is not None)
    began = time.monotonic()
    restart()
    newcomers = {kind: of_kind(other, kind, f"{base}/{kind}", ttl=30) for kind in KINDS}
    for kind, handle in newcomers.items():
        if saved is None:  # the holds survived: nobody else comes in
            assert not _acquire_retrying(handle, blocking=False), kind
    for handles in held.values():
        for handle in handles:
            if saved is not None or handle.lost:
                with pytest.raises(LockLost):
                    handle.release()
            else:
                _release_retrying(handle)
    for kind, handle in newcomers.items():
        assert _acquire_retrying(handle, blocking=False), kind
        if handle.kind == "write":
            before = issued[handle.name]
            assert handle.fencing_token > max(before), (handle.fencing_token, before)
        handle.release()
    return {"acquisitions": sum(map(len, issued.values())) + len(newcomers), "overlaps": 0,
            "repeated_tokens": 0, "worst_call_s": round(time.monotonic() - began, 3)}


@pytest.mark.parametrize("persistence", ["aof", "snapshot"])
def test_redis_restarted_while_every_kind_is_held(persistence: str, tmp_path: Path) -> None:
    require_redis()
    options = (("--appendonly", "yes", "--appendfsync", "always") if persistence == "aof"
               else ("--save", "", "--dbfilename", "dump.rdb"))
    server = Server(tmp_path, options)
    server.start()
    backend = private_backend("redis", server.url("socket_timeout=1"))
    other = private_backend("redis", server.url("socket_timeout=1"))

    def restart() -> None:
        server.proc.kill()  # type: ignore[union-attr]
        server.proc.wait(10)  # type: ignore[union-attr]
        server.start()  # the same port and dir: the AOF, or the older snapshot

    def save() -> None:
        raw = redis.Redis(port=server.port)
        raw.save()
        raw.close()

    try:
        figures = _restart_while_held(backend, other, "restarted", restart,
                                      save if persistence == "snapshot" else None)
    finally:
        backend.close()
        other.close()
        server.kill()
    record("restart-kinds", f"redis-{persistence}", processes=1, **figures)


@pytest.mark.parametrize("alias", ["pg-lease", "mysql-lease"])
def test_every_session_ended_while_every_kind_is_held(alias: str, unique) -> None:
    """Lease mode: a share or a writer's row outlives its session (every session of the
    database ended: PostgreSQL's terminated, MariaDB's killed, and the grants' advisory
    or named locks with them)."""
    if alias.startswith("pg"):
        require_pg()
    else:
        require_mysql()
    backend = locks[alias]
    end = _terminate_all if alias.startswith("pg") else _kill_all_mysql
    try:
        figures = _restart_while_held(backend, backend, unique("terminated"),
                                      lambda: _ended(end, backend.database))
    finally:
        connections[backend.database].close()
    record("restart-kinds", alias, processes=1, **figures)


def _ended(end: Callable[[str], int], database: str) -> None:
    assert end(database) >= 1


def test_zookeeper_restarted_while_every_kind_is_held(request: pytest.FixtureRequest) -> None:
    """The sessions survive a quick restart (else the holds are lost, and say so)."""
    own: ZooKeeper = request.getfixturevalue("zookeeper")
    backend = private_backend("zk", own.hosts, SESSION_TIMEOUT=8, CONNECT_TIMEOUT=1)
    other = private_backend("zk", own.hosts, SESSION_TIMEOUT=8, CONNECT_TIMEOUT=1)

    def restart() -> None:
        own.signal(signal.SIGKILL)
        own.servers.stop_entries([own.entry])
        own.start()
        time.sleep(1.0)  # the clients reconnect

    try:
        figures = _restart_while_held(backend, other, "restarted-kinds", restart)
    finally:
        backend.close()
        other.close()
    record("restart-kinds", "zk", processes=1, **figures)


# -- 5. a waiter's entry deleted under it ---------------------------------------------------

#: (alias, kind) whose waiter leaves no entry of ours in the server, and why.
NO_WAITER_ENTRY = {
    ("pg-lease", "read"): "a waiting reader queues on an advisory lock in the server's lock "
    "manager: no row of ours",
    ("pg-lease", "semaphore"): "a waiting permit queues on an advisory lock: no row of ours",
    ("sqlite-lease", "read"): "SQLite waiters poll with backoff: no entry",
    ("sqlite-lease", "write"): "SQLite waiters poll (a writer's intent is test_database_kinds')",
    ("sqlite-lease", "semaphore"): "SQLite waiters poll with backoff: no entry",
    ("redis-unfair", "read"): "FAIR False: waiters retry, they do not queue",
    ("redis-unfair", "write"): "FAIR False: waiters retry, they do not queue",
    ("redis-unfair", "semaphore"): "FAIR False: waiters retry, they do not queue",
}
WAITER_ENTRIES = [(alias, kind) for alias in KIND_ALIASES for kind in KINDS
                  if (alias, kind) not in NO_WAITER_ENTRY]


def _entry(alias: str, backend: Any, kind: str, name: str) -> tuple[Callable[[], bool], Any]:
    """Whether the waiter's entry is there, and how to delete it."""
    key = backend.make_key(name)
    if alias.startswith("redis"):
        client, queue = backend.redis.sync(), backend.keys_for(key).queue
        return (lambda: client.zcard(queue) == 1), (lambda: client.delete(queue))
    if alias.startswith("zk"):
        kazoo, parent = backend.client.get(), backend.parent_of(key)
        if kind == "semaphore":  # the waiter holds the gate, watching the leases
            gate = f"{parent}/__gate__"

            def gate_nodes() -> list[str]:
                return kazoo.get_children(gate) if kazoo.exists(gate) else []

            return (lambda: len(gate_nodes()) == 1), (
                lambda: kazoo.delete(f"{gate}/{gate_nodes()[0]}"))

        def delete_waiter() -> None:
            children = sorted(kazoo.get_children(parent), key=lambda c: c[-10:])
            kazoo.delete(f"{parent}/{children[-1]}")  # the last in line: the waiter's

        return (lambda: len(kazoo.get_children(parent)) == 2), delete_waiter
    if alias.startswith("mysql"):
        # The row a waiter writes for the listing: the wait itself is a named lock.
        def waiter_rows(statement: str) -> int:
            side = mysql_side(backend.database)
            try:
                cursor = side.cursor()
                cursor.execute(statement, [key])
                return int(cursor.fetchone()[0] if cursor.description else cursor.rowcount)
            finally:
                side.close()

        return (lambda: waiter_rows(
            "SELECT count(*) FROM django_distlock_waiter WHERE name = %s") == 1,
            lambda: waiter_rows("DELETE FROM django_distlock_waiter WHERE name = %s"))
    params = psycopg_params(backend.database)

    def intent(statement: str) -> Any:
        with psycopg.connect(**params, autocommit=True) as side:
            return side.execute(statement, [key]).fetchone()

    return (
        lambda: bool((intent("SELECT intent_owner FROM django_distlock_lock WHERE name = %s")
                      or [None])[0]),
        lambda: intent("UPDATE django_distlock_lock SET intent_owner = NULL, intent_until = NULL"
                       " WHERE name = %s RETURNING 1"),
    )


def test_every_kind_has_its_waiter_entry_deleted_or_a_reason() -> None:
    assert set(WAITER_ENTRIES) | set(NO_WAITER_ENTRY) == {
        (alias, kind) for alias in KIND_ALIASES for kind in KINDS}


@pytest.mark.parametrize(("alias", "kind"), WAITER_ENTRIES)
def test_a_kinds_waiters_entry_deleted_under_it(alias: str, kind: str, unique,
                                                tmp_path: Path) -> None:
    require(alias)
    backend, name = locks[alias], unique(f"entry-{kind}")
    holders = hold_all(backend, kind, name, ttl=30)
    path = tmp_path / "history.jsonl"
    rec = HistoryRecorder(path)
    result: dict[str, Any] = {}

    def wait() -> None:
        began = time.monotonic()
        try:
            with rec.hold(of_kind(backend, kind, name, ttl=30, timeout=4)):
                time.sleep(0.05)
            result["got"] = True
        except LockNotAcquired:
            result["got"] = False
        except BaseException as exc:
            result["error"] = exc
        finally:
            result["took"] = time.monotonic() - began

    present, delete = _entry(alias, backend, kind, name)
    thread = threading.Thread(target=lambda: in_thread(wait))
    thread.start()
    assert eventually(present, timeout=5), "the waiter's entry never showed"
    delete()
    for handle in holders:
        handle.release()
    with contextlib.ExitStack() as stack:  # newcomers that exclude the waiter, at once
        for newcomer in [of_kind(backend, BLOCKED_BY[kind], name, ttl=30, blocking=False)
                         for _ in range(LIMIT if kind == "semaphore" else 1)]:
            with contextlib.suppress(LockNotAcquired, BackendUnavailable):
                stack.enter_context(rec.hold(newcomer))
        time.sleep(0.3)
    thread.join(15)
    assert not thread.is_alive()
    rec.close()
    assert "error" not in result, result
    assert result["took"] < 4 + 2, result
    events = load(path)
    report = check(events)
    report.raise_if_bad()
    assert eventually(lambda: free_for_all(backend, kind, name), timeout=5)
    record_history("waiter-deleted-kinds", f"{alias}/{kind}", report, events, bound_s=4.0,
                   waiter_granted=result["got"])
