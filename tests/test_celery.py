"""``@distlock`` on Celery tasks run by real workers (tests/celery_workers.py): two
``celery worker`` processes, prefork pools of two children each, the real Redis as
broker; tasks in tests/celery_tasks.py."""

from __future__ import annotations

import io
import os
import signal
import time
import uuid
from typing import Any

import psycopg
import pytest
import redis
from celery import shared_task
from django.conf import settings

import testproject.celery
from django_distlock import distlock, locks
from django_distlock.contrib.celery.retry import retry_delay, retry_task
from django_distlock.exceptions import AlreadyQueued, UnsupportedOperation
from django_distlock.testing.history import check, load

from . import celery_tasks as tasks
from .celery_workers import Running, workers_fixture  # noqa: F401  (celery_workers)
from .conftest import LIBRARY_DB, eventually, psycopg_params, require_memcached

# The workers use the PostgreSQL test database (pg-lease, pg-tx): have it made.
pytestmark = [pytest.mark.servers, pytest.mark.second_env, LIBRARY_DB]
RESULT = 30  # seconds a test waits for a task's result at most


def _name() -> str:
    return uuid.uuid4().hex[:10]


def _note(run: Running, what: str, timeout: float = 20) -> dict[str, Any]:
    assert eventually(lambda: tasks.notes(run.path, what), timeout), f"no {what!r} note"
    return tasks.notes(run.path, what)[0]


# -- decoration order -------------------------------------------------------------------


def test_distlock_on_a_task_object_is_refused_when_decorating() -> None:
    def body(n: int) -> int:
        return n

    task = shared_task(name=f"tests.wrong_order_{_name()}")(body)  # a proxy
    with pytest.raises(TypeError, match="below the task decorator"):
        distlock("x:{n}")(task)
    bound = testproject.celery.app.task(name=f"tests.wrong_order_{_name()}")(body)
    with pytest.raises(TypeError, match="Celery task object"):
        distlock("x:{n}")(bound)
    assert distlock("x:{n}", using="locmem")(body)(3) == 3  # the right order works


def test_a_task_called_in_process_gives_its_name_and_id_as_context() -> None:
    from django_distlock.context import current_context

    @testproject.celery.app.task(bind=True, name=f"tests.context_{_name()}")
    def where(self: Any) -> str:
        return current_context() or str(_celery_context())

    result = where.apply()
    assert _celery_context() is None  # outside a task
    assert result.get() == f"{where.name}[{result.id}]"
    assert where() == where.name  # called directly: a task, with no id


def _celery_context() -> str | None:
    from django_distlock.context import _celery_task

    return _celery_task()


def test_retry_countdowns_grow_and_jitter_stays_within_half() -> None:
    assert [retry_delay(n, 1.0, 2.0, 5.0, False) for n in range(5)] == [1, 2, 4, 5, 5]
    draws = [retry_delay(3, 1.0, 2.0, 60.0, True) for _ in range(200)]
    assert all(4.0 <= d <= 8.0 for d in draws) and len(set(draws)) > 1
    with pytest.raises(ValueError):
        retry_task(1.0, factor=0.5)


# -- mutual exclusion across workers, from a recorded history ---------------------------


def test_tasks_under_distlock_never_overlap_across_workers(celery_workers: Running) -> None:
    run, name = celery_workers, _name()
    path = run.path / f"exclusive-{name}"
    path.mkdir()
    results = [tasks.exclusive.delay(str(path), name, 0.1) for _ in range(8)]
    pids = {result.get(timeout=RESULT) for result in results}
    report = check(load(path))
    report.raise_if_bad()
    assert report.holds == 8
    assert len(pids) >= 2, "one child ran every task: nothing was contended"
    # The check can fail: the same tasks without the lock overlap.
    loose = run.path / f"unlocked-{name}"
    loose.mkdir()
    for result in [tasks.unlocked.delay(str(loose), name, 0.3) for _ in range(4)]:
        result.get(timeout=RESULT)
    assert check(load(loose)).overlaps


def test_a_task_that_misses_its_lock_is_skipped(celery_workers: Running) -> None:
    name = _name()
    with locks["redis"].lock(f"celery:{name}", ttl=30):
        assert tasks.skipped.delay(name).get(timeout=RESULT) == "skipped"
    assert tasks.skipped.delay(name).get(timeout=RESULT) == "ran"


def test_a_task_that_misses_its_lock_is_retried_by_celery(celery_workers: Running) -> None:
    run, name = celery_workers, _name()
    path = run.path / f"retried-{name}"
    path.mkdir()
    with locks["redis"].lock(f"celery:{name}", ttl=60):
        result = tasks.retried.delay(str(path), name)
        # Countdowns of 0.1, 0.2, 0.4, 0.4 ... s (at most; half of it at least).
        assert eventually(lambda: _meta(run, result.id)["status"] == "RETRY", RESULT)
        time.sleep(0.6)
    retries = result.get(timeout=RESULT)
    assert retries >= 1
    assert [note["retries"] for note in tasks.notes(path, "retried-ran")] == [retries]


# -- a child killed mid-task: the lock is freed, the redelivery granted ------------------


@pytest.mark.parametrize(
    ("task", "freed_within"),
    [(tasks.killable_redis, (1.0, 3.5)), (tasks.killable_pg_tx, (0.0, 1.0))],
    ids=["redis-ttl", "pg-transaction"],
)
def test_a_child_killed_mid_task_frees_the_lock_for_the_redelivery(
    celery_workers: Running, task: Any, freed_within: tuple[float, float]
) -> None:
    run, name = celery_workers, _name()
    path = run.path / f"killed-{name}"
    path.mkdir()
    result = task.delay(str(path), name)
    first = _wait_started(path, result.id, 1)[0]
    alias = "redis" if task is tasks.killable_redis else "pg-tx"
    assert locks[alias].is_locked(f"celery:{name}")
    os.kill(first["pid"], signal.SIGKILL)
    killed = time.monotonic()
    # Freed when the test first sees it free, or when the redelivery got it (whichever
    # comes first: the redelivery may take it back at once).
    freed = None
    while freed is None and time.monotonic() - killed < RESULT:
        if not locks[alias].is_locked(f"celery:{name}"):
            freed = time.monotonic()
        elif len(tasks.notes(path, f"started-{result.id}")) > 1:
            freed = tasks.notes(path, f"started-{result.id}")[1]["t"]
        time.sleep(0.01)
    assert freed is not None
    second = _wait_started(path, result.id, 2)[1]
    assert second["redelivered"] and second["pid"] != first["pid"]
    # The worker requeued the message (acks_late, reject_on_worker_lost) instead of
    # storing WorkerLostError; the redelivery ran to the end.
    assert eventually(lambda: _meta(run, result.id)["status"] == "SUCCESS", RESULT)
    assert _meta(run, result.id)["result"] == "done"
    low, high = freed_within
    # Redis: the lease (2 s, renewed every 2/3 s while the child lived) ends on its own;
    # transaction mode: the server rolls back when the dead child's connection closes.
    assert low <= freed - killed <= high, freed - killed


def _meta(run: Running, task_id: str) -> dict[str, Any]:
    meta: dict[str, Any] = run.app.backend.get_task_meta(task_id, cache=False)
    return meta


def _wait_started(path: Any, task_id: str, count: int) -> list[dict[str, Any]]:
    what = f"started-{task_id}"
    assert eventually(lambda: len(tasks.notes(path, what)) >= count, RESULT)
    return tasks.notes(path, what)


# -- prefork: a child never uses a connection inherited from its parent -------------------


def test_pool_children_use_their_own_connections_not_the_parents(celery_workers: Running) -> None:
    """Each worker's main process took a Redis and a PostgreSQL-lease lock before forking
    its pool (worker_init); its children then take locks too. The children open their
    own connections, and the parent's stay open and unused (checked on the servers)."""
    run = celery_workers
    parents = tasks.notes(run.path, "parent")
    assert {note["pid"] for note in parents} == set(run.workers.pids())
    time.sleep(2.0)  # the parents' connections have been idle this long, at least
    began = time.time()
    children = {tasks.probe.delay(str(run.path)).get(timeout=RESULT) for _ in range(4)}
    probes = [note for note in tasks.notes(run.path, "child") if note["pid"] in children]
    assert len(children) >= 2
    parent_ports = {alias: {port for note in parents for port in note["opened"][alias]}
                    for alias in tasks.PROBED}
    assert all(parent_ports.values()), parents
    for note in probes:  # each child has connections of its own to both servers
        assert note["ppid"] in run.workers.pids()
        for alias in tasks.PROBED:
            assert set(note["all"][alias]) - parent_ports[alias], (alias, note, parents)
    idle = {int(client["addr"].rsplit(":", 1)[1]): client["idle"]
            for client in redis.Redis.from_url(settings.REDIS_URL).client_list()}
    for port in parent_ports["redis"]:
        assert port in idle and int(idle[port]) >= 2, (port, idle.get(port))
    with psycopg.connect(**psycopg_params("pg")) as conn:
        rows = conn.execute(
            "SELECT client_port, state, extract(epoch FROM state_change) FROM pg_stat_activity"
            " WHERE client_port = ANY(%s)", [sorted(parent_ports["pg-lease"])]
        ).fetchall()
    assert len(rows) == len(parent_ports["pg-lease"]), rows
    assert all(state == "idle" and changed < began for _, state, changed in rows), rows


# -- auto_renew keeps a long task's lease; a lost lease is reported ------------------------


def test_a_long_task_keeps_its_lease_with_auto_renew(celery_workers: Running) -> None:
    run, name = celery_workers, _name()
    path = run.path / f"renewed-{name}"
    path.mkdir()
    result = tasks.renewed_long.delay(str(path), name, 4.0)  # a 2 s lease, held 4 s
    began = _wait_note(path, "renewed-started")["t"]
    time.sleep(max(began + 2.5 - time.monotonic(), 0))  # past the first lease's end
    assert not locks["redis"].lock(f"celery:{name}", blocking=False).acquire()
    assert result.get(timeout=RESULT) == "kept"


def test_a_task_paused_past_its_ttl_is_told_its_lease_was_lost(celery_workers: Running) -> None:
    run, name = celery_workers, _name()
    path = run.path / f"paused-{name}"
    path.mkdir()
    result = tasks.renewed.delay(str(path), name, 1.0)
    child = _wait_note(path, "renewed-started")["pid"]
    os.kill(child, signal.SIGSTOP)  # the task and its renewal thread stop
    try:
        time.sleep(1.5)  # past the 1 s lease
        taken = locks["redis"].lock(f"celery:{name}", ttl=5, blocking=False)
        assert taken.acquire(), "the paused task's lease did not end"
        taken.release()
    finally:
        os.kill(child, signal.SIGCONT)
    assert result.get(timeout=RESULT) == "lost"
    assert [note["error"] for note in tasks.notes(path, "lost")] == ["LockLost"]


def _wait_note(path: Any, what: str) -> dict[str, Any]:
    assert eventually(lambda: tasks.notes(path, what), RESULT), f"no {what!r} note"
    return tasks.notes(path, what)[0]


# -- the holder context: the task's name and id -----------------------------------------


def test_a_lock_held_by_a_task_lists_its_name_and_id(celery_workers: Running) -> None:
    from django.core.management import call_command

    run, name = celery_workers, _name()
    path = run.path / f"holds-{name}"
    path.mkdir()
    result = tasks.holds.delay(str(path), name, 2.0)
    _wait_note(path, "holds-started")
    [info] = locks["redis"].held_locks(prefix=f"celery:{name}").locks
    assert info.context == f"tests.holds[{result.id}]"
    out = io.StringIO()
    call_command("distlock", "list", "--alias", "redis", "--prefix", f"celery:{name}",
                 stdout=out)
    assert f"tests.holds[{result.id}]" in out.getvalue()
    assert result.get(timeout=RESULT) == result.id


# -- enqueue-once ------------------------------------------------------------------------


#: The enqueue-once task of each alias the scenarios run on.
ONCE_TASKS = {"redis": tasks.once_redis, "pg-lease": tasks.once_pg,
              "cache-memcached": tasks.once_memcached}


@pytest.mark.parametrize("alias", ONCE_TASKS)
def test_enqueue_once_refuses_an_equal_task_while_queued_or_running(
    celery_workers: Running, alias: str
) -> None:
    if alias == "cache-memcached":
        require_memcached()
    run, n = celery_workers, int(uuid.uuid4().int % 10**9)
    task = ONCE_TASKS[alias]
    path = str(run.path)
    first = task.delay(path, n, 1.0)
    with pytest.raises(AlreadyQueued) as refused:
        task.delay(path, n, 1.0)
    assert refused.value.alias == alias and locks[alias].is_locked(refused.value.name)
    marker = task.apply_async((path, n, 1.0), once={"graceful": True})
    assert marker.state == "REJECTED"
    other = task.delay(path, n + 1)  # other arguments: another lock
    assert other.get(timeout=RESULT) == n + 1
    assert first.get(timeout=RESULT) == n
    assert not locks[alias].is_locked(refused.value.name)  # released before the result
    again = task.delay(path, n)  # the first ended: its lock was released
    assert again.get(timeout=RESULT) == n
    failing = task.delay(path, n + 2, 0.0, True)
    with pytest.raises(ValueError):
        failing.get(timeout=RESULT)
    assert task.delay(path, n + 2).get(timeout=RESULT) == n + 2  # a failure released it
    ran = [note["n"] for note in tasks.notes(run.path, "once-ran") if n <= note["n"] <= n + 2]
    assert sorted(ran) == sorted([n, n + 1, n, n + 2, n + 2])
    if alias == "pg-lease":
        # The enqueuing session gave back each grant's generation lock (the worker
        # released the grant): none is left held here, however many were sent.
        held = locks[alias].sessions.get().execute(  # gives back, then counts
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND pid = pg_backend_pid()", []
        ).fetchone()[0]
        assert held == 0


@pytest.mark.parametrize("alias", ["redis", "cache-memcached"])
def test_enqueue_once_releases_only_its_own_grant(celery_workers: Running, alias: str) -> None:
    """A task whose lease ran out does not free the lock a later enqueue took: the
    worker's release is checked against the enqueuer's token on the server."""
    if alias == "cache-memcached":
        require_memcached()
    run, n = celery_workers, int(uuid.uuid4().int % 10**9)
    path, name = str(run.path), f"once:{n}"  # once_redis's key is "once:{n}"
    # The 1 s lease runs out within the first task's run: on memcached 1 to 2 s after
    # the run starts (whole seconds, docs/cache.md), so that run lasts 3 s there.
    hold = 3.0 if alias == "cache-memcached" else 2.0
    short = tasks.once_redis.apply_async((path, n, hold), once={"using": alias, "ttl": 1})
    assert eventually(lambda: not locks[alias].is_locked(name), 10)  # ran out, running on
    later = tasks.once_redis.apply_async((path, n, 3.0), once={"using": alias, "ttl": 30})
    assert not short.ready(), "the first task ended before the later enqueue"
    assert short.get(timeout=RESULT) == n
    assert locks[alias].is_locked(name), "the ended task freed the later enqueue's lock"
    with pytest.raises(AlreadyQueued):
        tasks.once_redis.apply_async((path, n), once={"using": alias})
    assert later.get(timeout=RESULT) == n
    assert eventually(lambda: not locks[alias].is_locked(name), 5)


def test_enqueue_once_needs_a_lease() -> None:
    with pytest.raises(UnsupportedOperation, match="lease"):
        tasks.once_redis.apply_async(("x", 1), once={"using": "sqlite-tx"})
    assert tasks.once_pg.once_name(("p", 3), {}) == 'once:tests.once_pg:{"fail":false,' \
        '"hold":0.0,"n":3,"path":"p"}'
