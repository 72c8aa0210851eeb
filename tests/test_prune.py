"""Pruning the database backend's idle rows: only idle rows go, a name used again after
its row was pruned gets tokens above every token it had, and a prune running in a loop
beside processes taking and releasing the same names never gives a lock twice or a
token twice (checked on the recorded history with the shipped checker)."""

from __future__ import annotations

import io
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.transaction import TransactionManagementError

from django_distlock import locks
from django_distlock.backends.database.sql import HIGH_WATER
from django_distlock.exceptions import LockLost, LockNotAcquired
from django_distlock.testing.history import HistoryRecorder, check, load

from .conftest import LIBRARY_DB, PG_ALIASES, SQLITE_ALIASES, require_pg
from .histories import FORK, done, fork_ready

pytestmark = [
    pytest.mark.django_versions,
    LIBRARY_DB,
]

ALIASES = SQLITE_ALIASES + PG_ALIASES


def _setup(alias: str) -> None:
    if alias.startswith("pg"):
        require_pg()


def _row(alias: str, name: str) -> tuple[Any, ...] | None:
    backend = locks[alias]
    key = backend.make_key(name)
    with connections[backend.database].cursor() as cursor:
        cursor.execute("SELECT fencing FROM django_distlock_lock WHERE name = %s", [key])
        return cursor.fetchone()


def _token(alias: str, name: str, **options: Any) -> int:
    with locks[alias].lock(name, ttl=0.05, **options) as handle:
        return int(handle.fencing_token)


def _prune_idle(alias: str, name: str) -> None:
    time.sleep(0.1)  # every lease of ``name`` has ended
    assert locks[alias].prune(idle_for=3600) == 0  # not idle long enough
    assert _row(alias, name) is not None
    assert locks[alias].prune(idle_for=0, batch=1) >= 1  # in batches of one
    assert _row(alias, name) is None


@pytest.mark.parametrize("alias", ALIASES)
def test_a_name_pruned_and_used_again_gets_higher_tokens(alias: str, unique) -> None:
    _setup(alias)
    pruned_and_used_again(alias, unique)


def pruned_and_used_again(alias: str, unique: Any) -> None:
    """A name pruned and used again goes on above its old tokens; a held name is kept
    (MySQL's cases run it from test_backend_database_mysql.py, in the single tier)."""
    name, kept = unique("pruned"), unique("kept")
    first = [_token(alias, name) for _ in range(3)]
    assert first == sorted(set(first))
    if alias == "sqlite-tx":  # a hold is this connection's transaction: refused in one
        with locks[alias].lock(kept), pytest.raises(TransactionManagementError):
            locks[alias].prune(idle_for=0)
        _prune_idle(alias, name)
    else:
        with locks[alias].lock(kept, ttl=30) as held:
            _prune_idle(alias, name)
            assert _row(alias, kept) is not None  # held: never pruned
            held.extend(30)
            assert not held.lost
    again = _token(alias, name)
    assert again > first[-1], (first, again)
    backend = locks[alias]
    if backend.vendor == "mysql":  # tokens come from a counter: no reserved row
        return
    # The reserved row is neither pruned nor listed.
    time.sleep(0.1)
    locks[alias].prune(idle_for=0)
    with connections[backend.database].cursor() as cursor:
        cursor.execute("SELECT fencing FROM django_distlock_lock WHERE name = %s", [HIGH_WATER])
        assert cursor.fetchone()[0] >= again
    if backend.supports_listing:
        assert all(not info.name.startswith(HIGH_WATER) for info in backend.held_locks())


def test_readers_and_writers_after_a_prune_get_higher_tokens(unique) -> None:
    """PostgreSQL's share routines make rows too (with migration 0011's trigger)."""
    require_pg()
    name = unique("rw")
    with locks["pg-lease"].write_lock(name, ttl=0.05) as writer:
        before = writer.fencing_token
    time.sleep(0.1)
    assert locks["pg-lease"].prune(idle_for=0) >= 1
    with locks["pg-lease"].read_lock(name, ttl=5) as reader:
        assert reader.fencing_token > before
        assert locks["pg-lease"].prune(idle_for=0) == 0 or _row("pg-lease", name)
        assert _row("pg-lease", name) is not None  # a live reader keeps the row


def test_bad_arguments_are_refused() -> None:
    backend = locks["sqlite-lease"]
    for bad in (-1, "1", True):
        with pytest.raises(ValueError):
            backend.prune(idle_for=bad)
    for bad in (0, 10**9, 1.5):
        with pytest.raises(ValueError):
            backend.prune(batch=bad)


# -- a prune in a loop beside acquirers of the same names ------------------------------

NAMES, PROCESSES, RUN_FOR = 3, 3, 2.0


def _rounds(alias: str, names: list[str], path: Path, go: Any, out: Any) -> None:
    try:
        go.wait(30)
        rec, held, missed = HistoryRecorder(path), 0, 0
        end = time.monotonic() + RUN_FOR
        i = 0
        while time.monotonic() < end:
            name = names[i % len(names)]
            i += 1
            try:
                with rec.hold(locks[alias].lock(name, ttl=0.1, timeout=2)) as handle:
                    rec.write(name, handle.fencing_token, accepted=True)
                    time.sleep(0.001)
                held += 1
            except LockNotAcquired:
                missed += 1
            except LockLost:  # held past its 0.1 s lease on a busy machine: allowed
                held += 1
            # Leases lapse between holds, so each row turns idle under the prune for a
            # few ms before the next acquire of its name.
            time.sleep(random.uniform(0.1, 0.2))
        rec.close()
        out.put(("ok", held, missed))
    except BaseException as exc:
        out.put(("error", repr(exc), 0))
    finally:
        done()


@pytest.mark.parametrize("alias", ALIASES)
def test_pruning_in_a_loop_never_repeats_a_token(alias: str, unique, tmp_path: Path) -> None:
    _setup(alias)
    pruning_in_a_loop(alias, unique, tmp_path)


def pruning_in_a_loop(alias: str, unique: Any, tmp_path: Path) -> None:
    """Processes take names while a thread prunes them in a loop: the recorded history
    shows no token given twice and no overlap."""
    names = [unique(f"race{i}") for i in range(NAMES)]
    path = tmp_path / "history.jsonl"
    fork_ready()
    go, out = FORK.Event(), FORK.Queue()
    procs = [FORK.Process(target=_rounds, args=(alias, names, path, go, out))
             for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    pruned, stop = [0], threading.Event()

    def prune_loop() -> None:
        try:
            while not stop.is_set():
                pruned[0] += locks[alias].prune(idle_for=0, batch=2)
        finally:
            locks.close_all()
            connections.close_all()

    pruner = threading.Thread(target=prune_loop)
    try:
        go.set()
        pruner.start()
        results = [out.get(timeout=RUN_FOR + 60) for _ in procs]
    finally:
        stop.set()
        pruner.join(30)
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    assert [r for r in results if r[0] == "error"] == []
    report = check(load(path))
    report.raise_if_bad()
    holds = sum(r[1] for r in results)
    assert report.writes == holds > 20
    assert pruned[0] > 5, f"the prune deleted {pruned[0]} rows: the race was not run"


def test_the_command_prunes_each_alias_or_says_why_not(unique) -> None:
    name = unique("cmd")
    _token("sqlite-lease", name)
    time.sleep(0.1)
    out = io.StringIO()
    call_command("distlock", "prune", "--alias", "sqlite-lease", "--idle", "0", stdout=out)
    assert "sqlite-lease: pruned" in out.getvalue()
    assert _row("sqlite-lease", name) is None
    out = io.StringIO()
    call_command("distlock", "prune", "--alias", "locmem", stdout=out)
    assert "locmem: nothing to prune" in out.getvalue()


def test_the_housekeeping_task_prunes(unique) -> None:
    from django_distlock.contrib.celery.tasks import prune_task
    from django_distlock.housekeeping import prune_idle_rows

    name = unique("task")
    _token("sqlite-lease", name)
    time.sleep(0.1)
    result = prune_idle_rows(idle_for=0, aliases=["sqlite-lease", "locmem"])
    assert result["sqlite-lease"] >= 1 and "locmem" not in result
    assert _row("sqlite-lease", name) is None
    # The Celery task a beat schedule names runs the same function.
    again = unique("beat")
    _token("sqlite-lease", again)
    time.sleep(0.1)
    assert prune_task.name == "django_distlock.prune_idle_rows"
    answer = prune_task.apply(kwargs={"idle_for": 0, "aliases": ["sqlite-lease"]}).get()
    assert answer["sqlite-lease"] >= 1 and _row("sqlite-lease", again) is None


def test_a_listing_during_a_prune_leaves_the_high_water_row_out(unique) -> None:
    """Transaction mode lists the rows locked by an open transaction; a prune's batch
    locks the high-water row while it raises it."""
    require_pg()
    import psycopg

    from django_distlock.backends.database import DatabaseBackend

    from .conftest import psycopg_params

    # No KEY_PREFIX: the listing's range takes every row.
    unprefixed = DatabaseBackend("pg-tx-unprefixed",
                                 {"OPTIONS": {"DATABASE": "pg", "MODE": "transaction"}})
    _token("pg-lease", unique("mark"))
    time.sleep(0.1)
    assert locks["pg-lease"].prune(idle_for=0) >= 1  # the high-water row exists
    with psycopg.connect(**psycopg_params("pg")) as side:  # a batch, mid-way
        side.execute("SELECT 1 FROM django_distlock_lock WHERE name = %s FOR UPDATE",
                     [HIGH_WATER])
        try:
            listed = [info.name for info in unprefixed.held_locks()]
        finally:
            unprefixed.close()
        side.rollback()
    assert not any(HIGH_WATER in name or "high-water" in name for name in listed), listed


def test_an_insert_waiting_on_a_row_being_pruned_starts_above_it(unique) -> None:
    """The race migration 0011's advisory lock closes: an INSERT of a name's row (the
    wait procedure's, a reader's grant's) that meets the row a batch is deleting waits
    for the batch to commit, then inserts; its token must come from the high-water mark
    that batch raised, not from one read before the wait. A side transaction plays the
    batch, step by step; another inserts as the wait procedure does."""
    require_pg()
    import psycopg

    from django_distlock.backends.database.prune import PG_PRUNE_LOCK

    from .conftest import psycopg_params

    name = unique("mid-batch")
    tokens = [_token("pg-lease", name) for _ in range(3)]
    key = locks["pg-lease"].make_key(name)
    inserted: list[Any] = []

    def insert() -> None:
        with psycopg.connect(**psycopg_params("pg"), autocommit=True) as other:
            inserted.append(other.execute(
                "INSERT INTO django_distlock_lock (name, owner, fencing, host, thread)"
                " VALUES (%s, 'x', 1, '', '') ON CONFLICT (name) DO NOTHING"
                " RETURNING fencing", [key]).fetchone())

    with psycopg.connect(**psycopg_params("pg")) as side:
        side.execute("SELECT pg_advisory_xact_lock(%s, %s)", list(PG_PRUNE_LOCK))
        top = side.execute("DELETE FROM django_distlock_lock WHERE name = %s RETURNING fencing",
                           [key]).fetchone()[0]
        assert top == tokens[-1] >= 3
        inserter = threading.Thread(target=insert)
        inserter.start()
        time.sleep(0.5)  # the INSERT is under way, waiting for this batch
        assert not inserted
        side.execute(
            "INSERT INTO django_distlock_lock (name, fencing, host, thread)"
            " VALUES (%s, %s, '', '') ON CONFLICT (name) DO UPDATE"
            " SET fencing = greatest(django_distlock_lock.fencing, excluded.fencing)",
            [HIGH_WATER, top],
        )
        side.commit()
        inserter.join(30)
    assert inserted and inserted[0] is not None and inserted[0][0] > top, (tokens, inserted)
