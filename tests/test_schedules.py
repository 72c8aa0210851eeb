"""``once_per_slot`` in one process, on the real lock servers: the decision, the
``min_hold`` keep, the ``max_hold`` lease, and the system check.

The races between processes (cron-like firing, Celery beat) are in
``test_schedules_processes.py``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.db import transaction
from django.db.transaction import TransactionManagementError
from django.test import override_settings

from django_distlock import locks
from django_distlock.contrib.schedules import once_per_slot, scheduled_jobs
from django_distlock.exceptions import LockLost

from .conftest import (
    LIBRARY_DB,
    eventually,
    needs_pg,
    require_memcached,
    require_pg,
    require_redis,
    require_zookeeper,
)

pytestmark = [
    pytest.mark.django_versions,
    LIBRARY_DB,
]

#: Backends whose locks expire: min_hold and max_hold apply.
LEASE_ALIASES = [
    "sqlite-lease", "pg-lease", "redis", "redlock", "redis-cluster", "cache-memcached",
    "cache-redis", "locmem",
]


def _require(alias: str) -> None:
    if needs_pg(alias):
        require_pg()
    elif alias.startswith("redis") or alias == "redlock":
        require_redis(cluster=alias == "redis-cluster", redlock=alias == "redlock")
    elif alias.startswith("cache"):
        require_memcached()


def _counting(name: str, alias: str, **options: Any) -> tuple[Callable[[], Any], list[int]]:
    runs: list[int] = []

    @once_per_slot(name, using=alias, skip_value="skipped", **options)
    def job() -> str:
        runs.append(1)
        return "ran"

    return job, runs


@pytest.mark.parametrize("alias", LEASE_ALIASES)
def test_kept_for_min_hold_then_free(alias: str, unique: Callable[[str], str]) -> None:
    _require(alias)
    job, runs = _counting(unique("job"), alias, max_hold=30, min_hold=0.6)
    assert job() == "ran"
    # A late node of the same slot: the lock is kept, it skips without waiting.
    assert job() == "skipped"
    assert locks[alias].is_locked(job.job.name)
    time.sleep(0.6)
    # Past min_hold the next slot runs (memcached: up to 2 s later, its TTLs are whole
    # seconds rounded up).
    assert eventually(lambda: not locks[alias].is_locked(job.job.name), timeout=3)
    assert job() == "ran"
    assert len(runs) == 2


@pytest.mark.parametrize("alias", LEASE_ALIASES)
def test_min_hold_zero_releases_at_once(alias: str, unique: Callable[[str], str]) -> None:
    _require(alias)
    job, _ = _counting(unique("job"), alias, max_hold=30)
    assert [job(), job()] == ["ran", "ran"]
    assert not locks[alias].is_locked(job.job.name)


@pytest.mark.parametrize("alias", ["sqlite-lease", "redis"])
def test_a_crashed_winner_frees_the_job_after_max_hold(
    alias: str, unique: Callable[[str], str]
) -> None:
    _require(alias)
    job, _ = _counting(unique("job"), alias, max_hold=0.5)
    # Another node won the slot and died: its lease (max_hold) was never released.
    crashed = locks[alias].lock(job.job.name, ttl=0.5, blocking=False)
    assert crashed.acquire()
    assert job() == "skipped"
    time.sleep(0.7)
    assert job() == "ran"


@pytest.mark.parametrize("alias", ["sqlite-lease", "redis"])
def test_a_failed_run_keeps_the_slot(alias: str, unique: Callable[[str], str]) -> None:
    _require(alias)
    name = unique("job")

    @once_per_slot(name, using=alias, max_hold=30, min_hold=0.5)
    def failing() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        failing()
    assert failing() is None  # kept: the slot was used, even by a failed run
    time.sleep(0.7)
    with pytest.raises(RuntimeError):
        failing()


def test_a_run_longer_than_max_hold(
    unique: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    require_redis()
    name = unique("job")

    def slow() -> str:
        time.sleep(0.5)
        return "done"

    logged = once_per_slot(name, using="redis", max_hold=0.2, min_hold=0.1)(slow)
    with caplog.at_level(logging.WARNING, logger="django_distlock"):
        assert logged() == "done"
    assert "ran past its lease" in caplog.text
    raising = once_per_slot(name, using="redis", max_hold=0.2, on_lost="raise")(slow)
    with pytest.raises(LockLost):
        raising()

    def slow_failure() -> None:
        time.sleep(0.5)
        raise RuntimeError("the job's own")

    failing = once_per_slot(name, using="redis", max_hold=0.2, on_lost="raise")(slow_failure)
    with pytest.raises(RuntimeError, match="the job's own"):
        failing()  # not LockLost: the job's exception is what the caller must see


@pytest.mark.parametrize("alias", ["sqlite-lease", "redis"])
def test_async_job(alias: str, unique: Callable[[str], str]) -> None:
    _require(alias)
    runs: list[int] = []

    @once_per_slot(unique("job"), using=alias, max_hold=30, min_hold=0.5, skip_value="skipped")
    async def job() -> str:
        runs.append(1)
        return "ran"

    async def twice() -> list[str]:
        return [await job(), await job()]

    assert asyncio.run(twice()) == ["ran", "skipped"]
    assert len(runs) == 1


def _fire_in_transactions(job: Callable[[], Any], using: str, firings: int) -> list[str]:
    """Fire ``job`` ``firings`` times, each inside a caller's ``atomic()`` block on
    ``using`` that the job's exception rolls back; return what each firing raised."""
    raised = []
    for _ in range(firings):
        try:
            with transaction.atomic(using=using):
                job()
        except Exception as exc:
            raised.append(type(exc).__name__)
    return raised


def test_a_slot_is_refused_inside_the_callers_transaction_on_sqlite(
    unique: Callable[[str], str],
) -> None:
    """SQLite's lease statements run on the caller's connection: inside its ``atomic()``
    block the grant and the ``min_hold`` keep would be rolled back with it (a second
    firing of the slot ran the job again), and a connection of its own would wait for the
    write lock that block holds. So the call is refused before anything is written."""
    name, runs = unique("job"), []

    @once_per_slot(name, using="sqlite-lease", max_hold=30, min_hold=5)
    def failing() -> None:
        runs.append(1)
        raise RuntimeError("boom")

    raised = _fire_in_transactions(failing, "default", 2)
    assert runs == [], f"the slot ran {len(runs)} time(s) inside the caller's transaction"
    assert raised == ["LeaseInTransaction"] * 2
    assert not locks["sqlite-lease"].is_locked(name)

    @once_per_slot(name, using="sqlite-lease", max_hold=30, min_hold=5)
    async def afailing() -> None:
        runs.append(1)
        raise RuntimeError("boom")

    # An async job fired from sync code: its statements run on this thread's connection.
    assert _fire_in_transactions(async_to_sync(afailing), "default", 1) == [
        "LeaseInTransaction"
    ]
    assert runs == []
    # Autocommit turned off by the caller is a transaction as well; the refusal is
    # Django's TransactionManagementError too, and says what to do.
    transaction.set_autocommit(False)
    try:
        with pytest.raises(TransactionManagementError, match=r"outside transaction\.atomic"):
            failing()
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    assert runs == []
    # Outside the block the same job runs, and keeps its slot.
    with pytest.raises(RuntimeError):
        failing()
    assert failing() is None
    assert runs == [1]


def test_a_slot_on_postgres_outlives_the_callers_rollback(
    unique: Callable[[str], str],
) -> None:
    """PostgreSQL's lease statements run on the backend's own sessions: the caller's
    rollback leaves the slot's lock and its ``min_hold`` keep in place."""
    require_pg()
    runs: list[int] = []

    @once_per_slot(unique("job"), using="pg-lease", max_hold=30, min_hold=5)
    def failing() -> None:
        runs.append(1)
        raise RuntimeError("boom")

    assert _fire_in_transactions(failing, "pg", 2) == ["RuntimeError"]
    assert runs == [1]
    assert locks["pg-lease"].is_locked(failing.job.name)


def test_bad_options() -> None:
    with pytest.raises(ValueError, match=r"min_hold .* is above max_hold"):
        once_per_slot("j", max_hold=1, min_hold=2)
    with pytest.raises(TypeError, match="max_hold must"):
        once_per_slot("j", max_hold="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_hold must"):
        once_per_slot("j", max_hold=0)
    with pytest.raises(ValueError, match="min_hold must"):
        once_per_slot("j", max_hold=1, min_hold=-1)
    with pytest.raises(ValueError, match="min_hold must"):
        once_per_slot("j", max_hold=1, min_hold=float("nan"))
    with pytest.raises(TypeError, match="min_hold must"):
        once_per_slot("j", max_hold=1, min_hold="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        once_per_slot("", max_hold=1)
    with pytest.raises(ValueError, match="on_lost"):
        once_per_slot("j", max_hold=1, on_lost="skip")  # type: ignore[arg-type]


def _messages() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(tags=["distlock"]) if m.id.endswith("040")]


def test_check_min_hold_on_locks_that_do_not_expire(unique: Callable[[str], str]) -> None:
    require_zookeeper()
    name = unique("job")
    assert _messages() == []

    def job() -> None:
        return None

    tx = once_per_slot(name, using="sqlite-tx", max_hold=30, min_hold=5)(job)
    zk = once_per_slot(name, using="zk", max_hold=30, min_hold=5)(job)
    plain = once_per_slot(name, using="sqlite-tx", max_hold=30)(lambda: None)
    messages = _messages()
    assert sorted((m.id, m.obj.split(".")[-1]) for m in messages) == [
        ("distlock.W040", "job"), ("distlock.W040", "job"),
    ], messages
    assert "do not expire" in messages[0].msg and "lease mode" in (messages[0].hint or "")
    del tx, zk, plain
    gc.collect()
    assert _messages() == []  # the registry forgets jobs whose functions are gone


def test_check_unknown_alias(unique: Callable[[str], str]) -> None:
    job = once_per_slot(unique("job"), using="nowhere", max_hold=30)(lambda: None)
    [message] = _messages()
    assert message.id == "distlock.E040" and "'nowhere'" in message.msg
    assert job.job in scheduled_jobs()
    del job
    gc.collect()
    # A missing "default" is E001's, a broken alias E002's: no E040 beside them.
    with override_settings(DISTLOCK={"other": {"BACKEND": "django_distlock.nope.X"}}):
        on_default = once_per_slot(unique("job"), max_hold=30)(lambda: None)
        on_other = once_per_slot(unique("job"), using="other", max_hold=30)(lambda: None)
        assert _messages() == []
        ids = [m.id for m in checks.run_checks(tags=["distlock"])]
        assert "distlock.E001" in ids and "distlock.E002" in ids
    del on_default, on_other
    gc.collect()
