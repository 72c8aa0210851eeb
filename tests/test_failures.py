"""A failing server gives BackendUnavailable chained to the client error, then recovers."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connections

from django_distlock import locks
from django_distlock.backends.database.sessions import WATCHDOG_GRACE
from django_distlock.backends.redis import RedisBackend
from django_distlock.exceptions import BackendUnavailable, LockLost, LockNotHeld
from django_distlock.handle import Lock, hold_of
from django_distlock.testing.signals import signals_sent

from .conftest import LIBRARY_DB, eventually, in_thread, psycopg_params, require_pg
from .figures import record
from .private_redis import Server

pytestmark = LIBRARY_DB


def _terminate_lease_connection(backend) -> None:
    pid = backend.sessions.get().cursor.connection.info.backend_pid
    with psycopg.connect(**psycopg_params(backend.database), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_postgres_terminated_session_is_replaced_once(unique) -> None:
    """A lease session the server ended (terminated, or gone in a restart) costs no
    error while a new connection works: the call runs again, once, on a new session
    (the first call of every process used to fail after a server restart)."""
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique())
    assert handle.acquire()
    _terminate_lease_connection(backend)
    handle.release()  # on a new connection; the row still named this owner
    assert not handle.held and not backend.is_locked(handle.name)
    _terminate_lease_connection(backend)
    other = backend.lock(unique())
    assert other.acquire(blocking=False)
    other.release()


def test_postgres_a_retried_attempt_finds_its_own_grant(unique) -> None:
    """An attempt whose grant committed but whose answer was lost is retried with the same
    owner token: it takes its own grant again (a new fencing token) instead of missing."""
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique(), ttl=30)
    assert handle.acquire()
    acquisition = hold_of(handle).acquisition
    assert acquisition is not None
    again = acquisition.attempt()  # the same owner token, as a retry sends it
    assert again.fencing_token == handle.fencing_token + 1
    handle.release()


def test_postgres_refused_connection_is_unavailable(unique) -> None:
    """A lease connection the server refuses is BackendUnavailable too, on the first
    statement of a thread as on later ones."""
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique())
    backend.close()  # the next statement opens a new lease connection
    database = psycopg_params(backend.database)["dbname"]
    toggle = f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS %s'
    with psycopg.connect(**{**psycopg_params(backend.database), "dbname": "postgres"},
                         autocommit=True) as admin:
        admin.execute(toggle % "false")
        try:
            with pytest.raises(BackendUnavailable) as info:
                handle.acquire(blocking=False)
        finally:
            admin.execute(toggle % "true")
    assert "not currently accepting connections" in str(info.value.__cause__)
    assert handle.acquire(blocking=False)
    handle.release()


def test_postgres_a_frozen_server_does_not_hold_a_wait_past_its_timeout(unique) -> None:
    """The server process of a waiting session is frozen (SIGSTOP): the acquire ends at
    its timeout plus the watchdog's grace with BackendUnavailable (it used to wait until
    the server came back, 22 s for a 5 s timeout in the fault run)."""
    require_pg()
    backend, name = locks["pg-lease"], unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    box: dict = {}

    def wait() -> None:
        started = time.monotonic()
        try:
            box["got"] = backend.lock(name, ttl=30).acquire(timeout=2)
        except BackendUnavailable as exc:
            box["error"] = exc
        box["took"] = time.monotonic() - started

    thread = threading.Thread(target=lambda: in_thread(wait))
    thread.start()
    with psycopg.connect(**psycopg_params("pg"), autocommit=True) as admin:

        def waiting_pid() -> int | None:
            row = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE state = 'active'"
                " AND query LIKE 'CALL django_distlock_wait%%' AND pid <> pg_backend_pid()"
            ).fetchone()
            return row[0] if row else None

        assert eventually(lambda: waiting_pid() is not None)
        pid = waiting_pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            thread.join(20)
        finally:
            os.kill(pid, signal.SIGCONT)
    assert isinstance(box.get("error"), BackendUnavailable), box
    assert "did not answer" in str(box["error"])
    record("frozen-server", "pg-lease (wait)", worst_call_s=round(box["took"], 2),
           bound_s=2 + WATCHDOG_GRACE + 1.5)
    assert box["took"] < 2 + WATCHDOG_GRACE + 1.5
    holder.release()


def test_postgres_a_frozen_server_does_not_hold_an_extend_past_the_lease(unique) -> None:
    """The server process of a holder's session is frozen: extend() (the renewal
    thread's call) ends with BackendUnavailable once the lease it would extend has run
    out, plus the watchdog's grace, instead of hanging until the server comes back (and
    stalling every other renewal of the process)."""
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique(), ttl=2)
    assert handle.acquire()
    session = backend.sessions.get()  # this thread's: the one extend() uses here
    pid = session.cursor.connection.info.backend_pid
    os.kill(pid, signal.SIGSTOP)
    thaw = threading.Timer(15, os.kill, (pid, signal.SIGCONT))  # if extend() hangs
    thaw.start()
    started = time.monotonic()
    try:
        with pytest.raises(BackendUnavailable, match="did not answer"):
            handle.extend(30)
        took = time.monotonic() - started
    finally:
        thaw.cancel()
        os.kill(pid, signal.SIGCONT)
    record("frozen-server", "pg-lease (extend)", worst_call_s=round(took, 2),
           bound_s=2 + WATCHDOG_GRACE + 1.5)
    assert took < 2 + WATCHDOG_GRACE + 1.5


# -- a release whose outcome is unknown (a private Redis server, frozen) -------------------


@pytest.fixture
def redis_server(own_redis: Server) -> Server:
    return own_redis


@pytest.fixture
def sent() -> Iterator[list[tuple[str, str]]]:
    """The lock_released and lock_lost signals sent, as (signal, name)."""
    with signals_sent("lock_released", "lock_lost") as seen:
        yield seen


def _stalling_backend(server: Server) -> RedisBackend:
    """A backend on ``server`` whose calls give up after 1 s without an answer, its
    scripts loaded (a release stalled before its script was known would fail with
    NOSCRIPT when the server thaws, instead of going through)."""
    url = server.url("socket_timeout=1&socket_connect_timeout=1")
    backend = RedisBackend("own", {"LOCATION": url, "TTL": 30})
    warm = backend.lock("warm", ttl=30)
    assert warm.acquire()
    warm.release()
    return backend


def _release_while_frozen(server: Server, handle: Lock, frozen_for: float = 0) -> None:
    """Release ``handle`` while ``server`` is frozen: BackendUnavailable. The server
    thaws ``frozen_for`` seconds later (at least when the release gave up); the release
    written to the socket runs then."""
    server.pause()
    began = time.monotonic()
    try:
        with pytest.raises(BackendUnavailable):
            handle.release()
        time.sleep(max(0.0, frozen_for - (time.monotonic() - began)))
    finally:
        server.resume()


def test_a_release_that_raised_leaves_the_name_to_its_thread(redis_server: Server) -> None:
    """After a release that raised BackendUnavailable (the server froze), the thread may
    wait for the name again: the release's outcome is unknown, the thread no longer
    counts as its holder (it was refused with SelfDeadlock for the life of the process);
    the same after a ``with`` block whose exit raised."""
    backend = _stalling_backend(redis_server)
    try:
        handle = backend.lock("stalled", ttl=30)
        assert handle.acquire()
        _release_while_frozen(redis_server, handle)
        again = backend.lock("stalled", ttl=30)
        assert again.acquire(timeout=5)  # once the thawed server ran the release
        again.release()
        try:
            with pytest.raises(BackendUnavailable), backend.lock("stalled", ttl=30):
                redis_server.pause()  # the exit's release raises
        finally:
            redis_server.resume()
        third = backend.lock("stalled", ttl=30)
        assert third.acquire(timeout=5)
        third.release()
    finally:
        redis_server.resume()
        backend.close()


def test_a_retried_release_recognises_the_release_already_done(
    redis_server: Server, sent: list[tuple[str, str]]
) -> None:
    """A release that raised BackendUnavailable went through once the server thawed; the
    retry the docs invite finds the lock free: it returns quietly and sends
    lock_released, not LockLost and lock_lost (a false alert)."""
    backend = _stalling_backend(redis_server)
    try:
        handle = backend.lock("retried", ttl=30)
        assert handle.acquire()
        _release_while_frozen(redis_server, handle)
        assert eventually(lambda: not backend.is_locked("retried"))  # it went through
        handle.release()
        assert not handle.held
        assert [seen for seen in sent if seen[1] == "retried"] == [("lock_released", "retried")]
        with pytest.raises(LockNotHeld):
            handle.release()
    finally:
        backend.close()


def test_a_retried_release_still_reports_a_lease_that_ended_before_it(
    redis_server: Server, sent: list[tuple[str, str]]
) -> None:
    """The first release was sent after the lease had run out (and raised): the retry
    that finds the lock gone raises LockLost and sends lock_lost, as a release without
    the stall would have (the critical section may have run unprotected)."""
    backend = _stalling_backend(redis_server)
    try:
        handle = backend.lock("late", ttl=0.3)
        assert handle.acquire()
        time.sleep(0.45)
        _release_while_frozen(redis_server, handle)
        with pytest.raises(LockLost):
            handle.release()
        assert [seen for seen in sent if seen[1] == "late"] == [("lock_lost", "late")]
    finally:
        backend.close()


def test_no_loss_is_reported_for_a_renewed_lease_whose_release_raised(
    redis_server: Server, sent: list[tuple[str, str]]
) -> None:
    """An ``auto_renew`` lease whose release raised (the server froze) is renewed no
    more: the holder let go. It used to be renewed again, fail, and be reported lost
    once its lease ran out: a false lock_lost."""
    backend = _stalling_backend(redis_server)
    try:
        handle = backend.lock("renewed", ttl=1, auto_renew=True)
        assert handle.acquire()
        # Frozen past the lease's end: the watchdog would renew, fail, declare it lost.
        _release_while_frozen(redis_server, handle, frozen_for=1.5)
        time.sleep(0.2)
        handle.release()
        assert [seen for seen in sent if seen[1] == "renewed"] == [("lock_released", "renewed")]
    finally:
        backend.close()


def test_postgres_a_frozen_server_does_not_hold_a_release_past_the_lease(unique) -> None:
    """The server process of a holder's session is frozen (as in a partition): release()
    (a ``with`` exit, so a request) ends with BackendUnavailable by the lease's local end
    plus the watchdog's grace, as acquire and extend do (it waited for the server to come
    back: 54 s through a 45 s partition for a 2 s lease)."""
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique(), ttl=2)
    assert handle.acquire()
    session = backend.sessions.get()  # this thread's: the one release() uses here
    pid = session.cursor.connection.info.backend_pid
    os.kill(pid, signal.SIGSTOP)  # idle between statements: it holds no server-wide lock
    thaw = threading.Timer(15, os.kill, (pid, signal.SIGCONT))  # if release() hangs
    thaw.start()
    started = time.monotonic()
    try:
        with pytest.raises(BackendUnavailable, match="did not answer"):
            handle.release()
        took = time.monotonic() - started
    finally:
        thaw.cancel()
        os.kill(pid, signal.SIGCONT)
    record("frozen-server", "pg-lease (release)", worst_call_s=round(took, 2),
           bound_s=2 + WATCHDOG_GRACE + 1.5)
    assert took < 2 + WATCHDOG_GRACE + 1.5
    assert handle.held or handle.lost  # not released: the caller may call release() again
    assert eventually(lambda: not backend.is_locked(handle.name))  # the lease runs out


def _terminate(pid: int) -> None:
    with psycopg.connect(**psycopg_params("pg"), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def _token_of_a_grant(backend, name: str) -> int:
    def grant() -> int:
        with backend.lock(name, timeout=5) as other:
            return other.fencing_token

    return in_thread(grant)


def test_postgres_transaction_mode_tokens_increase_past_rolled_back_grants(unique) -> None:
    """A grant rolled back (the block raised) or whose session died (terminated, as in a
    server restart) does not give its token again: the next grant's is higher (it was
    the same, while the dead holder's handle still said held)."""
    require_pg()
    backend, name = locks["pg-tx"], unique()
    with pytest.raises(RuntimeError), backend.lock(name) as first:
        raise RuntimeError("rolled back")
    second = backend.lock(name)
    assert second.acquire()
    try:
        _terminate(connections["pg"].connection.info.backend_pid)
        third = _token_of_a_grant(backend, name)
        with pytest.raises(LockLost):
            second.release()
    finally:
        connections["pg"].close()
    assert first.fencing_token < second.fencing_token < third
