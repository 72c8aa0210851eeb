"""The contract on the database backend: SQLite in lease and transaction modes and
PostgreSQL in transaction mode (through Django's connections); PostgreSQL's lease mode,
whose statements run on the backend's own sessions, is ``test_backend_database_sessions.py``
(single tier: CONTRIBUTING.md, "The tiers")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction

from django_distlock import locks
from django_distlock.exceptions import (
    BackendUnavailable,
    ConnectionInUse,
    LockConfigurationError,
    LockLost,
    LockNotAcquired,
)
from django_distlock.handle import hold_of
from django_distlock.testing import LockContract

from .conftest import (
    LIBRARY_DB,
    advisory_locks,
    eventually,
    in_thread,
    psycopg_params,
    require_pg,
)
from .debugger import PauseOnReturn, require_gdb

pytestmark = [
    pytest.mark.django_versions,
    LIBRARY_DB,
]


class TestSQLiteLease(LockContract):
    alias = "sqlite-lease"


class TestSQLiteTransaction(LockContract):
    alias = "sqlite-tx"


class PostgresContract(LockContract):
    @pytest.fixture(autouse=True)
    def _pg(self) -> None:
        require_pg()


class TestPostgresTransaction(PostgresContract):
    alias = "pg-tx"


def _prepared_statements(backend) -> int:
    cursor = backend.sessions.get().cursor
    cursor.execute("SELECT count(*) FROM pg_prepared_statements")
    return cursor.fetchone()[0]


@pytest.mark.parametrize("prepare", [True, False])
def test_postgres_lease_statements_prepared_unless_disabled(settings, unique, prepare) -> None:
    """OPTIONS["PREPARE"]: prepared lease statements, or none (PgBouncer transaction pooling)."""
    require_pg()
    settings.DISTLOCK = {
        **settings.DISTLOCK,
        "pg-prepare": {"BACKEND": settings.DISTLOCK["pg-lease"]["BACKEND"],
                       "OPTIONS": {"DATABASE": "pg", "PREPARE": prepare}},
    }
    backend = locks["pg-prepare"]
    try:
        for grant in range(1, 4):
            with backend.lock(unique(), ttl=5) as handle:
                assert handle.fencing_token == grant
        assert (_prepared_statements(backend) >= 2) is prepare
    finally:
        backend.close()


def test_postgres_waiters_queue_in_the_server(unique) -> None:
    """A waiting thread heads the key's queue and waits for the holder's generation lock;
    a later one times out behind it; the release wakes the head, which is granted."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    first, key = holder.fencing_token, holder.key
    assert advisory_locks(backend, key, first) == 1  # the holder's generation lock

    def head() -> int | None:
        handle = backend.lock(name, ttl=30)
        assert handle.acquire(timeout=20)
        token = handle.fencing_token
        handle.release()
        return token  # the thread's lock connection is closed when the thread is collected

    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(token=head()))
    thread.start()
    assert eventually(lambda: advisory_locks(backend, key, first, granted=False) == 1)
    assert advisory_locks(backend, key, 0) == 1  # the head holds the queue
    assert in_thread(lambda: backend.lock(name, ttl=30).acquire(timeout=0.5)) is False
    holder.release()
    thread.join(30)
    assert box["token"] == first + 1
    for seed in (0, first, first + 1):
        assert advisory_locks(backend, key, seed) == 0  # nothing left behind
    again = backend.lock(name, ttl=30)
    assert again.acquire(blocking=False)
    again.release()


def test_postgres_a_first_attempt_does_not_pass_a_queued_waiter(unique) -> None:
    """A free lock with a waiter at the head of its queue goes to that waiter, not a newcomer."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique()
    first = backend.lock(name, ttl=30)
    assert first.acquire(blocking=False)  # creates the row
    first.release()
    # A side connection stands for a waiter at the head of the queue.
    with psycopg.connect(**psycopg_params("pg"), autocommit=True) as head:
        head.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [first.key])
        assert not backend.lock(name, ttl=30).acquire(blocking=False)
        head.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [first.key])
    newcomer = backend.lock(name, ttl=30)
    assert newcomer.acquire(blocking=False)
    newcomer.release()


def test_postgres_release_from_another_thread_gives_back_the_generation_lock(unique) -> None:
    """The generation lock lives on the acquiring thread's session: a release from another
    thread goes through that session when it is idle, and leaves the lock to it when busy."""
    require_pg()
    backend = locks["pg-lease"]
    idle = backend.lock(unique("idle"), ttl=30)
    assert idle.acquire()
    in_thread(idle.release)
    assert advisory_locks(backend, idle.key, 1) == 0
    busy = backend.lock(unique("busy"), ttl=30)
    assert busy.acquire()
    session = hold_of(busy).acquisition.granted_on
    with session.mutex:  # the acquiring thread is in the middle of a statement
        in_thread(busy.release)
    assert not busy.held and session.orphans == [(busy.key, 1)]
    assert advisory_locks(backend, busy.key, 1) == 1
    assert not backend.is_locked(busy.name)  # the session's next statement gives it back
    assert advisory_locks(backend, busy.key, 1) == 0 and session.orphans == []
    assert backend.lock(busy.name, ttl=30).acquire(blocking=False)


def test_postgres_waiter_served_after_force_release_and_expiry(unique) -> None:
    """A head whose holder never gives its generation lock back still gets the lock:
    after a force-release (within a second) and when an abandoned lease ends."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    waiter = backend.lock(name, ttl=30)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(got=waiter.acquire(timeout=20)))
    thread.start()
    assert eventually(lambda: advisory_locks(backend, holder.key, 1, granted=False) == 1)
    assert backend.force_release(name)
    thread.join(20)
    assert result["got"] and waiter.fencing_token == 2
    with pytest.raises(LockLost):
        holder.release()  # gives its generation lock back all the same
    assert advisory_locks(backend, holder.key, 1) == 0
    in_thread(waiter.release)

    abandoned = backend.lock(name, ttl=0.5)
    assert abandoned.acquire()  # never released: its session keeps the generation lock
    late = backend.lock(name, ttl=30)
    assert in_thread(lambda: late.acquire(timeout=20))
    assert late.fencing_token == abandoned.fencing_token + 1
    with pytest.raises(LockLost):
        abandoned.release()
    in_thread(late.release)


def _row(backend, key: str) -> dict:
    """The lock row of ``key``, read on the backend's own session (committed state)."""
    cursor = backend.sessions.get().cursor
    cursor.execute(
        "SELECT owner, fencing, expires_at, thread, next_owner, next_ttl, next_thread"
        " FROM django_distlock_lock WHERE name = %s",
        [key],
    )
    names = ("owner", "fencing", "expires_at", "thread", "next_owner", "next_ttl", "next_thread")
    return dict(zip(names, cursor.fetchone(), strict=True))


def _waiting_head(backend, holder, name: str, timeout: float = 20):
    """Start a thread waiting for ``name`` (held by ``holder``); return it, its handle and
    its result box once its reservation is in the row."""
    waiter = backend.lock(name, ttl=30)
    box: dict = {}

    def wait() -> None:
        try:
            box["got"] = waiter.acquire(timeout=timeout)
        except Exception as exc:  # the test looks at it
            box["error"] = exc

    thread = threading.Thread(target=wait, name="the-head")
    thread.start()
    assert eventually(lambda: _row(backend, holder.key)["next_owner"] is not None)
    return thread, waiter, box


def test_postgres_release_hands_over_to_the_reserved_head(unique) -> None:
    """The head reserves the lock while it is held; the release makes it the holder."""
    require_pg()
    backend = locks["pg-lease"]
    holder = backend.lock(unique(), ttl=30)
    assert holder.acquire()
    thread, waiter, box = _waiting_head(backend, holder, holder.name)
    reserved = _row(backend, holder.key)
    assert reserved["next_thread"].endswith("the-head") and reserved["next_ttl"] == 30
    assert reserved["owner"] is not None  # still the holder's
    holder.release()
    thread.join(20)
    assert box["got"] and waiter.fencing_token == holder.fencing_token + 1
    row = _row(backend, holder.key)
    assert row["thread"].endswith("the-head") and row["next_owner"] is None
    assert row["fencing"] == waiter.fencing_token
    in_thread(waiter.release)


def test_postgres_a_head_that_gives_up_withdraws_its_reservation(unique) -> None:
    require_pg()
    backend = locks["pg-lease"]
    holder = backend.lock(unique(), ttl=30)
    assert holder.acquire()
    thread, _, box = _waiting_head(backend, holder, holder.name, timeout=1.0)
    thread.join(20)
    assert box == {"got": False}
    assert _row(backend, holder.key)["next_owner"] is None
    holder.release()
    assert _row(backend, holder.key)["owner"] is None  # not handed to the departed waiter
    newcomer = backend.lock(holder.name, ttl=30)
    assert newcomer.acquire(blocking=False)
    assert newcomer.fencing_token == holder.fencing_token + 1
    newcomer.release()


def test_postgres_release_does_not_hand_over_to_a_dead_head(unique) -> None:
    """A reserved head whose session ended keeps its reservation in the row; the release
    sees that nobody waits behind it and frees the lock instead. (The head is a bare
    session calling the wait procedure: the backend's own waiters retry on a new
    session when theirs is terminated.)"""
    require_pg()
    backend = locks["pg-lease"]
    holder = backend.lock(unique(), ttl=30)
    assert holder.acquire()
    head = psycopg.connect(**psycopg_params("pg"), autocommit=True)
    pid = head.info.backend_pid
    call = threading.Thread(target=_call_wait_quietly, args=(head, holder.key, "e" * 32))
    call.start()
    assert eventually(lambda: _row(backend, holder.key)["next_owner"] == "e" * 32)
    with psycopg.connect(**psycopg_params("pg"), autocommit=True) as side:
        side.execute("SELECT pg_terminate_backend(%s)", [pid])
    call.join(20)
    assert _row(backend, holder.key)["next_owner"] is not None
    holder.release()
    row = _row(backend, holder.key)
    assert row["owner"] is None and row["next_owner"] is None
    newcomer = backend.lock(holder.name, ttl=30)
    assert newcomer.acquire(blocking=False)
    newcomer.release()


def _call_wait_quietly(connection: psycopg.Connection, key: str, owner: str) -> None:
    try:
        connection.execute(
            "CALL django_distlock_wait(%s, %s, 30, 'h', 1, 't', 20, NULL, NULL, NULL, NULL,"
            " NULL, NULL)",
            [key, owner],
        )
    except psycopg.Error:
        pass  # terminated, as the test means it to be
    finally:
        connection.close()


def test_postgres_a_reservation_outlives_a_lost_handover(unique) -> None:
    """A crash may lose a handover (its commit does not wait for the WAL flush): the row
    then shows the old holder and the reservation. Nobody else gets the lock before the
    reserved waiter's lease would have ended, and the next grant skips its fencing number."""
    require_pg()
    backend = locks["pg-lease"]
    holder = backend.lock(unique(), ttl=0.5)
    assert holder.acquire()
    with psycopg.connect(**psycopg_params("pg"), autocommit=True) as side:
        # What survives such a crash: the durable reservation of a waiter now gone,
        # stamped with the server's epoch of before the crash; crash recovery empties
        # the UNLOGGED epoch table (the TRUNCATE stands for it).
        side.execute(
            "UPDATE django_distlock_lock SET next_owner = %s, next_ttl = 1.5,"
            " next_epoch = django_distlock_epoch() WHERE name = %s",
            ["f" * 32, holder.key],
        )
        side.execute("TRUNCATE django_distlock_epoch")
    time.sleep(0.6)  # the old lease is over; the reserved one would run 1.5 s after it
    assert backend.is_locked(holder.name)
    assert not in_thread(lambda: backend.lock(holder.name, ttl=30).acquire(blocking=False))
    late = backend.lock(holder.name, ttl=30)
    assert in_thread(lambda: late.acquire(timeout=10))
    reserved_until = holder.expires_at.timestamp() + 1.5
    assert late.acquired_at.timestamp() >= reserved_until - 0.05  # DB clock vs its own grant
    assert late.fencing_token == holder.fencing_token + 2
    in_thread(late.release)


class _Interrupted(Exception):
    pass


def test_postgres_an_interrupted_wait_leaves_no_head_behind(unique) -> None:
    """A wait interrupted in the server (a signal handler raising: KeyboardInterrupt, say)
    closes its session: the queue is free for the next waiter, and the release does not
    hand the lock over to the interrupted one."""
    require_pg()
    backend = locks["pg-lease"]
    holder = backend.lock(unique(), ttl=30)
    assert in_thread(holder.acquire)  # on another thread's session

    def interrupt(signum, frame):
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(_Interrupted):
            backend.lock(holder.name, ttl=30).acquire(timeout=20)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert _row(backend, holder.key)["next_owner"] is not None  # it had reserved
    assert advisory_locks(backend, holder.key, 0) == 0  # nobody heads the queue
    holder.release()
    assert _row(backend, holder.key)["owner"] is None
    assert backend.lock(holder.name, ttl=30).acquire(blocking=False)


def test_postgres_missing_procedures_say_to_migrate(unique) -> None:
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique(), ttl=30)
    assert handle.acquire()
    rename = "ALTER PROCEDURE {}(text, text, bigint, boolean) RENAME TO {}"
    with psycopg.connect(**psycopg_params("pg"), autocommit=True) as side:
        side.execute(rename.format("django_distlock_release", "distlock_hidden"))
        try:
            with pytest.raises(BackendUnavailable, match=r"manage\.py migrate django_distlock"):
                handle.release()
        finally:
            side.execute(rename.format("distlock_hidden", "django_distlock_release"))
    assert handle.held  # a failed release keeps the lock; the next one works
    handle.release()


def test_postgres_timed_out_waits_unlock_only_what_they_hold(unique) -> None:
    """Waits that time out on the queue or on the holder's generation lock give back only
    locks their session holds: the server log gets no "you don't own a lock" warning
    (73 in one fault run)."""
    require_pg()
    log = os.environ.get("DISTLOCK_PG_LOG")
    if not log:
        pytest.fail("DISTLOCK_PG_LOG is not set: start PostgreSQL with scripts/servers.py.")
    backend, name = locks["pg-lease"], unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    before = _warnings(log)

    def short_waits() -> None:
        for timeout in (0.001, 0.02, 0.05, 1.1) * 3:
            assert not backend.lock(name, ttl=30).acquire(timeout=timeout)

    threads = [threading.Thread(target=lambda: in_thread(short_waits)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    holder.release()
    assert _warnings(log) == before


def _warnings(log: str) -> int:
    with open(log, encoding="utf-8", errors="replace") as lines:
        return sum("you don't own a lock" in line for line in lines)


@pytest.fixture
def pg_one(settings) -> Any:
    """A PostgreSQL lease alias whose asyncio tasks share one session: the next task
    needs the one a cancelled task had."""
    require_pg()
    settings.DISTLOCK = {
        **settings.DISTLOCK,
        "pg-one": {"BACKEND": settings.DISTLOCK["pg-lease"]["BACKEND"],
                   "OPTIONS": {"DATABASE": "pg", "ASYNC_SESSIONS": 1}},
    }
    return locks["pg-one"]


def test_postgres_a_cancelled_async_waiter_leaves_nothing_behind(pg_one, unique) -> None:
    """A task cancelled while it waits in the server: its call is stopped there, its
    session comes back to the pool (one session here: the next task needs it), and the
    lock goes to the next waiter."""
    backend, name = pg_one, unique()
    holder = backend.lock(name, ttl=30)
    assert in_thread(holder.acquire)

    async def main() -> bool:
        waiter = asyncio.ensure_future(backend.lock(name, ttl=30).aacquire(timeout=20))
        await asyncio.sleep(0.5)  # waiting in the server now
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        await asyncio.to_thread(in_thread, holder.release)
        async with backend.lock(name, ttl=30, timeout=5) as handle:
            return handle.held

    try:
        assert asyncio.run(main())
    finally:
        backend.close()


def test_postgres_a_cancelled_wait_withdraws_its_reservation(pg_one, unique) -> None:
    """A waiter at the head of the queue reserves the row, durably, and a release hands
    the lock to a reserved head whose session still holds its liveness lock. A cancelled
    wait's session ends a moment after its close reaches the server (later on a loaded
    machine): a reservation left for the session's end was handed the lock in that
    moment, by a release, and the name stayed held by a gone task for the lease's 30 s
    (CI on e41b0ad, the test above). The cancelled call withdraws its reservation on its
    own session before closing it."""
    backend, name = pg_one, unique()
    holder = backend.lock(name, ttl=30)
    assert in_thread(holder.acquire)

    def reserved_for() -> str | None:
        with connections["pg"].cursor() as cursor:
            cursor.execute("SELECT next_owner FROM django_distlock_lock WHERE name = %s",
                           [hold_of(holder).key])
            return cursor.fetchone()[0]

    async def main() -> str | None:
        handle = backend.lock(name, ttl=30)
        waiter = asyncio.ensure_future(handle.aacquire(timeout=20))
        assert await asyncio.to_thread(in_thread, lambda: eventually(reserved_for))
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        # The one session comes back once the cancelled call has settled.
        async with backend.lock(unique("other"), ttl=5, timeout=10):
            pass
        return await asyncio.to_thread(in_thread, reserved_for)

    try:
        assert asyncio.run(main()) is None
        in_thread(holder.release)
    finally:
        backend.close()


@pytest.mark.parametrize("mode", ["lease", "transaction"])
def test_an_unknown_database_alias_is_a_configuration_error(settings, mode: str) -> None:
    """OPTIONS["DATABASE"] naming no alias of DATABASES: the documented
    LockConfigurationError naming both aliases, at construction, before any query (it was
    Django's ConnectionDoesNotExist from the first call)."""
    settings.DISTLOCK = {
        "nowhere": {"BACKEND": "django_distlock.backends.database.DatabaseBackend",
                    "OPTIONS": {"DATABASE": "no-such-db", "MODE": mode}},
    }
    with pytest.raises(LockConfigurationError) as info:
        locks["nowhere"].lock("x").acquire(blocking=False)
    assert "'nowhere'" in str(info.value) and "'no-such-db'" in str(info.value)
    assert "DATABASES" in str(info.value)


def _timeouts(database: str) -> tuple[str, str]:
    with connections[database].cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
        )
        row = cursor.fetchone()
    return row[0], row[1]


def test_postgres_transaction_mode_wait_bounds_end_with_the_wait(unique) -> None:
    """The acquire's lock_timeout and statement_timeout bound its wait only: the locked
    block's queries run under the transaction's own settings (a 1.5 s query inside a lock
    taken with timeout=1 was cancelled at 1.0 s; timeout=None set one day)."""
    require_pg()
    backend = locks["pg-tx"]

    def run() -> list[tuple[str, str]]:
        seen = []
        with transaction.atomic(using="pg"):
            with connections["pg"].cursor() as cursor:
                cursor.execute("SET LOCAL statement_timeout = '9s'")
            before = _timeouts("pg")
            for timeout in (1, None):
                with backend.lock(unique(), timeout=timeout):
                    seen.append(_timeouts("pg"))
                    with connections["pg"].cursor() as cursor:
                        cursor.execute("SELECT pg_sleep(1.2)")
            seen.append(_timeouts("pg"))
        return [before, *seen]

    before, *seen = in_thread(run)
    assert before[1] == "9s"
    assert seen == [before] * 3


def test_postgres_transaction_mode_async_wait_bounds_end_with_the_wait(unique) -> None:
    """The same for asyncio tasks, which wait in 50 ms slices: a 0.2 s query inside
    the lock is not cancelled (it was, at the slice's end)."""
    require_pg()
    backend = locks["pg-tx"]

    def query() -> tuple[str, str]:
        with connections["pg"].cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.2)")
        return _timeouts("pg")

    async def main() -> tuple[str, str]:
        async with backend.lock(unique(), timeout=1):
            return await sync_to_async(query)()

    assert asyncio.run(main()) == in_thread(lambda: _timeouts("pg"))


def test_postgres_transaction_mode_grant_timer_that_fires_late_cancels_nothing_after(
        unique) -> None:
    """A waited grant runs under a statement_timeout (the wait's bound). When that timer
    fires after the grant's last interrupt check (its backend descheduled at the very end
    of the statement: CI, once), PostgreSQL keeps the cancel pending and raises it at the
    session's next statement: that was the holder's first query, or its COMMIT. Here gdb
    stops the waiter's backend as the grant's ``PortalRun`` returns (after the statement's
    last check, before the timer is disarmed) until the timer has fired: the grant is given
    up as a miss, the caller's statements are not cancelled, and the session is sound
    after."""
    require_pg()
    require_gdb()
    backend, name, timeout = locks["pg-tx"], unique(), 6.0
    held, release = threading.Event(), threading.Event()
    pids: list[int] = []
    outcome: list[str] = []

    def holder() -> None:
        with backend.lock(name, timeout=5):
            held.set()
            release.wait(60)
        connections.close_all()

    def waiter() -> None:
        with connections["pg"].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])
        try:
            with backend.lock(name, timeout=timeout), connections["pg"].cursor() as cursor:
                cursor.execute("SELECT 1")
                outcome.append("held; its statement ran")
        except LockNotAcquired:
            outcome.append("not acquired")
        except Exception as exc:  # the failure is the test's answer
            outcome.append(f"{type(exc).__name__}: {exc}")
        with backend.lock(name, timeout=5), connections["pg"].cursor() as cursor:
            cursor.execute("SELECT 1")
            outcome.append("sound after")
        connections.close_all()

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    threads[0].start()
    assert held.wait(10)
    threads[1].start()
    started: list[float] = []

    def grant_waits() -> bool:
        if not pids:
            return False
        with connections["pg"].cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM query_start) FROM pg_stat_activity"
                " WHERE pid = %s AND wait_event_type = 'Lock'", [pids[0]])
            row = cursor.fetchone()
        started[:] = [float(row[0])] if row else []
        return bool(row)

    assert eventually(grant_waits)
    # The grant's statement timer fires at the latest ``timeout`` s after it began.
    fires_by = started[0] + timeout
    with PauseOnReturn(pids[0], "PortalRun", until=fires_by + 0.5) as pause:
        assert time.time() < fires_by - 1, "gdb attached too late to stop the grant"
        release.set()
        for thread in threads:
            thread.join(60)
    assert pause.hit, pause.output
    assert outcome == ["not acquired", "sound after"]


def test_postgres_transaction_mode_token_passes_a_row_above_the_sequence(unique) -> None:
    """A row whose token is above the fencing sequence (a name used in lease mode before,
    say): the grant draws past it, so its token is still higher, and the next one too."""
    require_pg()
    backend, name = locks["pg-tx"], unique()
    key = backend.make_key(name)
    with psycopg.connect(**psycopg_params("pg"), autocommit=True) as admin:
        top = admin.execute("SELECT last_value FROM django_distlock_fencing").fetchone()[0]
        admin.execute(
            "INSERT INTO django_distlock_lock (name, fencing, host, thread)"
            " VALUES (%s, %s, '', '')",
            [key, top + 500],
        )
    tokens = [in_thread(lambda: _grant_token(backend, name)) for _ in range(2)]
    assert top + 500 < tokens[0] < tokens[1]


def _grant_token(backend, name: str) -> int:
    with backend.lock(name, timeout=5) as lease:
        return lease.fencing_token


# -- transaction mode: asyncio tasks of one event loop share one connection ------------


def _tasks_take(alias: str, names: list[str], blocking: bool) -> list[tuple[str, int]]:
    """Tasks of one event loop each take ``names[i]`` in transaction mode (``async with``,
    0.1 s holds); return what happened, in order: ("in", i, token), ("out", i, token) or
    ("refused", i, 0)."""
    events: list[tuple[str, int, int]] = []

    async def task(index: int) -> None:
        try:
            async with locks[alias].lock(names[index], blocking=blocking, timeout=10) as lease:
                events.append(("in", index, lease.fencing_token))
                await asyncio.sleep(0.1)
                events.append(("out", index, lease.fencing_token))
        except ConnectionInUse:
            events.append(("refused", index, 0))

    async def main() -> None:
        await asyncio.gather(*(task(i) for i in range(len(names))))

    in_thread(lambda: asyncio.run(main()))
    return events


@pytest.mark.parametrize("alias", ["sqlite-tx", "pg-tx"])
def test_transaction_mode_tasks_of_one_loop_are_served_one_at_a_time(alias: str,
                                                                     unique) -> None:
    """Three tasks of one event loop take one name: they hold it one after another, with
    increasing tokens (they shared the thread's connection, so the second UPDATE ran in
    the transaction that held the row lock: all three held at once, tokens 1, 2, 3). A
    task taking another name while one holds waits too (its block would be a savepoint
    of the holder's transaction); without waiting, it is refused with ConnectionInUse
    before any SQL, and so is sync code of another task on the loop's thread."""
    if alias.startswith("pg"):
        require_pg()
    for names in ([unique("one")] * 3, [unique("a"), unique("b"), unique("c")]):
        events = _tasks_take(alias, names, blocking=True)
        assert [kind for kind, _, _ in events] == ["in", "out"] * 3, events
        assert [index for _, index, _ in events[::2]] == [index for _, index, _ in events[1::2]]
        tokens = [token for _, _, token in events[::2]]
        assert len(set(names)) > 1 or tokens == sorted(set(tokens)), tokens
    events = _tasks_take(alias, [unique("x"), unique("y")], blocking=False)
    assert sorted(kind for kind, _, _ in events) == ["in", "out", "refused"], events

    backend = locks[alias]

    def sync_take() -> None:
        with backend.lock(unique("z")):
            pass

    async def holder_and_sync_code() -> None:
        async with backend.lock(unique("x")):
            with pytest.raises(ConnectionInUse):
                await asyncio.ensure_future(sync_to_async(sync_take)())  # another task

    in_thread(lambda: asyncio.run(holder_and_sync_code()))


@pytest.mark.parametrize("alias", ["sqlite-tx", "pg-tx"])
def test_transaction_mode_one_task_nests_its_own_locks(alias: str, unique) -> None:
    """One task may still nest transaction-mode locks, and take them one after another."""
    if alias.startswith("pg"):
        require_pg()
    backend = locks[alias]

    async def main() -> list[bool]:
        seen = []
        async with backend.lock(unique("outer")) as outer, backend.lock(unique("in")) as inner:
            seen += [outer.held, inner.held]
        async with backend.lock(unique("outer")) as again:
            seen.append(again.held)
        return seen

    assert in_thread(lambda: asyncio.run(main())) == [True, True, True]
