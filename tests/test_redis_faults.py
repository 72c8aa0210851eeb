"""The Redis backend under faults, with real OS processes and real Redis servers.

Mutual exclusion and FIFO order are read from the hold histories that worker
processes record (``CLOCK_MONOTONIC`` is system-wide on Linux, so times from
different processes compare). Holders are SIGKILLed and SIGSTOPped; a private
``redis-server`` per test is killed, restarted and frozen under a holder.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_distlock import locks, signals
from django_distlock.backends.redis import RedisBackend
from django_distlock.backends.redis.acquisition import READ_GRACE
from django_distlock.backends.redis.giveback import GIVE_BACKS
from django_distlock.exceptions import BackendUnavailable, LockLost, LockNotHeld

from .conftest import eventually, in_thread, require_redis, soak
from .figures import record
from .histories import FORK
from .histories import done as _done
from .histories import fork_ready as _fork_ready
from .histories import history as _history
from .histories import overlaps as _overlaps
from .private_redis import Server

# -- 1. mutual exclusion of 8 processes ---------------------------------------------


def test_the_overlap_check_sees_unlocked_workers(unique) -> None:
    require_redis()
    assert _overlaps(_history(None, unique(), workers=8, rounds=5)) != []


@pytest.mark.parametrize("alias", ["redis", "redis-unfair", "redlock"])
def test_eight_processes_never_overlap(alias: str, unique) -> None:
    require_redis(redlock=alias == "redlock")
    history = _history(alias, unique("exclusion"), workers=8, rounds=15)
    assert len({pid for _, _, pid in history}) == 8  # every process served
    assert _overlaps(history) == []


# -- 2. a SIGKILLed holder -----------------------------------------------------------


def _hold_forever(alias: str, name: str, ttl: float, ready: Any) -> None:
    handle = locks[alias].lock(name, ttl=ttl)
    assert handle.acquire(timeout=10)
    ready.set()
    time.sleep(600)


def test_sigkilled_holder_frees_the_lock_within_its_ttl(unique) -> None:
    require_redis()
    name = unique("killed")
    _fork_ready()
    ready = FORK.Event()
    proc = FORK.Process(target=_hold_forever, args=("redis", name, 1.5, ready))
    proc.start()
    try:
        assert ready.wait(30)
        acquired_by_child = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    finally:
        if proc.is_alive():
            proc.kill()
    backend = locks["redis"]
    handle = backend.lock(name, ttl=30)
    assert handle.acquire(blocking=False) is False  # not freed by the death itself
    assert backend.is_locked(name)
    assert handle.acquire(timeout=3) is True
    freed_after = time.monotonic() - acquired_by_child
    record("sigkill", "redis", ttl_s=1.5, freed_s=round(freed_after, 2), bound_s=1.5 + 0.5)
    assert freed_after < 1.5 + 0.5, freed_after
    handle.release()


# -- 3. a SIGSTOPped holder past its TTL ------------------------------------------


def _stopped_holder(name: str, ready: Any, resumed: Any, out: Any) -> None:
    handle = locks["redis"].lock(name, ttl=1)
    assert handle.acquire(timeout=10)
    out.put(("token", handle.fencing_token))
    ready.set()
    assert resumed.wait(60)  # the parent stops this process meanwhile, then resumes it
    report: dict[str, Any] = {"lost": handle.lost, "held": handle.held}
    try:
        handle.extend()
        report["extend"] = "returned"
    except LockLost:
        report["extend"] = "LockLost"
    except Exception as exc:
        report["extend"] = repr(exc)
    try:
        handle.release()
        report["release"] = "returned"
    except LockLost as exc:
        report["release"] = "LockLost" if isinstance(exc, LockNotHeld) else repr(exc)
    except Exception as exc:
        report["release"] = repr(exc)
    out.put(("report", report))
    _done()


def test_sigstopped_holder_past_its_ttl_finds_its_lock_lost(unique) -> None:
    require_redis()
    name = unique("stopped")
    _fork_ready()
    ready, resumed, out = FORK.Event(), FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_stopped_holder, args=(name, ready, resumed, out))
    proc.start()
    try:
        assert ready.wait(30)
        tag, old_token = out.get(timeout=10)
        assert tag == "token"
        os.kill(proc.pid, signal.SIGSTOP)
        newcomer = locks["redis"].lock(name, ttl=30)
        assert newcomer.acquire(blocking=False) is False  # the stopped holder's lease runs
        assert newcomer.acquire(timeout=5) is True  # ... until its TTL
        os.kill(proc.pid, signal.SIGCONT)
        resumed.set()  # after SIGCONT: set() waits for the sleeping waiter to wake
        tag, report = out.get(timeout=30)
        proc.join(10)
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    assert tag == "report"
    record("sigstop", "redis", lost=report["lost"], release=report["release"],
           repeated_tokens=int(newcomer.fencing_token <= old_token))
    assert report == {"lost": True, "held": False, "extend": "LockLost", "release": "LockLost"}
    assert proc.exitcode == 0
    assert newcomer.held
    assert locks["redis"].is_locked(name)
    assert newcomer.fencing_token > old_token
    newcomer.release()


# -- 4. FIFO across processes ---------------------------------------------------------


def _fifo_waiter(alias: str, name: str, index: int, started: Any, out: Any) -> None:
    handle = locks[alias].lock(name, ttl=30, timeout=30)
    started.set()
    with handle:
        began = time.monotonic_ns()
        time.sleep(0.01)
    out.put((began, index))
    _done()


def test_waiting_processes_are_served_in_arrival_order(unique) -> None:
    require_redis()
    name = unique("fifo")
    holder = locks["redis"].lock(name, ttl=30)
    assert holder.acquire()
    _fork_ready()  # the parent's handle stays held on the server; its connection is closed
    out = FORK.Queue()
    procs = []
    try:
        for index in range(5):
            started = FORK.Event()
            proc = FORK.Process(target=_fifo_waiter, args=("redis", name, index, started, out))
            proc.start()
            procs.append(proc)
            assert started.wait(10)
            time.sleep(0.15)  # it has asked (and queued) by now
        holder.release()
        # A newcomer asking right after the release arrived last: it queues behind.
        newcomer = locks["redis"].lock(name, ttl=1)
        barged = newcomer.acquire(blocking=False)
        if barged:
            newcomer.release()
        served = sorted(out.get(timeout=30) for _ in procs)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert barged is False
    assert [index for _, index in served] == [0, 1, 2, 3, 4]
    assert [proc.exitcode for proc in procs] == [0] * 5


# -- 5. a private Redis server: restarted, stopped, frozen -------------------------


@pytest.fixture
def server(own_redis: Server) -> Server:
    return own_redis


@pytest.fixture
def lost_signals() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    signals.lock_lost.connect(receiver, weak=False)
    try:
        yield sent
    finally:
        signals.lock_lost.disconnect(receiver)


def test_restarted_redis_loses_the_lock_and_fencing_still_grows(server: Server) -> None:
    backend = RedisBackend("own", {"LOCATION": server.url(), "TTL": 5})
    try:
        holder = backend.lock("restart", ttl=30)
        assert holder.acquire()
        before = holder.fencing_token
        server.kill()
        server.start()  # same port, empty: no persistence
        with pytest.raises(LockLost):
            holder.release()  # never a silent success
        assert not holder.held
        newcomer = backend.lock("restart", ttl=30)
        assert newcomer.acquire(blocking=False)
        record("restart", "redis (empty)", grants=2,
               repeated_tokens=int(newcomer.fencing_token <= before))
        assert newcomer.fencing_token > before
        newcomer.release()
    finally:
        backend.close()


def test_stopped_redis_raises_backend_unavailable(server: Server) -> None:
    backend = RedisBackend(
        "own", {"LOCATION": server.url("socket_timeout=1&socket_connect_timeout=1"), "TTL": 5}
    )
    try:
        warm = backend.lock("warm-killed")
        assert warm.acquire()  # a pooled connection to the server, which goes away
        warm.release()
        server.kill()
        handle = backend.lock("down", ttl=5)
        began = time.monotonic()
        with pytest.raises(BackendUnavailable) as caught:
            handle.acquire(timeout=2)
        record("frozen-server", "redis (stopped: acquire)",
               worst_call_s=round(time.monotonic() - began, 2), bound_s=2 + 1.5)
        assert time.monotonic() - began < 2 + 1.5
        assert isinstance(caught.value.__cause__, redis.RedisError)
        assert not handle.held
        began = time.monotonic()
        with pytest.raises(BackendUnavailable) as caught:
            handle.acquire(blocking=False)
        assert time.monotonic() - began < 1.5
        assert isinstance(caught.value.__cause__, redis.RedisError)
    finally:
        backend.close()


def test_frozen_redis_raises_backend_unavailable_within_the_socket_timeout(
    server: Server,
) -> None:
    backend = RedisBackend(
        "own", {"LOCATION": server.url("socket_timeout=1&socket_connect_timeout=1"), "TTL": 5}
    )
    try:
        warm = backend.lock("warm-frozen")
        assert warm.acquire()
        warm.release()
        server.pause()
        handle = backend.lock("frozen", ttl=5)
        began = time.monotonic()
        with pytest.raises(BackendUnavailable) as caught:
            handle.acquire(timeout=2)
        assert time.monotonic() - began < 2 + 1.5
        assert isinstance(caught.value.__cause__, redis.RedisError)
    finally:
        server.resume()
        backend.close()


def test_frozen_redis_holds_no_call_past_its_own_bound(server: Server) -> None:
    """A frozen server held every call for the socket timeout (redis-py 8's default:
    5 s; none at all before): on an open connection an acquire now ends at its
    timeout plus READ_GRACE, a release at the lease's end plus READ_GRACE, each with
    BackendUnavailable. (Opening a connection stays bounded by the socket timeouts.)"""
    backend = RedisBackend("own", {"LOCATION": server.url(), "TTL": 5})
    try:
        holder = backend.lock("frozen-holder", ttl=2)
        assert holder.acquire()
        pool = backend.redis.sync().connection_pool
        spare = pool.get_connection()  # a second open connection for the hot path
        spare.connect()
        backend.redis.wire.keep(pool, spare)
        server.pause()
        handle = backend.lock("frozen", ttl=5)
        began = time.monotonic()
        with pytest.raises(BackendUnavailable):
            handle.acquire(timeout=1)
        assert time.monotonic() - began < 1 + READ_GRACE + 0.5
        began = time.monotonic()
        with pytest.raises(BackendUnavailable):
            holder.release()  # its lease ends 2 s after the grant
        record("frozen-server", "redis (release)",
               worst_call_s=round(time.monotonic() - began, 2), bound_s=2 + READ_GRACE + 0.5)
        assert time.monotonic() - began < 2 + READ_GRACE + 0.5
        began = time.monotonic()  # a task, on a connection it opens (in the bound too)
        with pytest.raises(BackendUnavailable):
            asyncio.run(backend.lock("frozen-task", ttl=5).aacquire(timeout=1))
        assert time.monotonic() - began < 1 + READ_GRACE + 0.5
    finally:
        server.resume()
        backend.close()


def test_watchdog_marks_the_lock_lost_when_redis_freezes_past_the_lease(
    server: Server, lost_signals: list[dict[str, Any]]
) -> None:
    backend = RedisBackend("own", {"LOCATION": server.url("socket_timeout=0.5"), "TTL": 5})
    try:
        handle = backend.lock("frozen-lease", ttl=1, auto_renew=True)
        with pytest.raises(LockLost), handle:
            server.pause()
            try:
                # The watchdog sees the lease run out while renewals fail, and says so
                # before the server (or the ``with`` exit) could.
                assert eventually(lambda: len(lost_signals) > 0, timeout=2.5)
                time.sleep(max(0.0, 2.5 - 1.0))
            finally:
                server.resume()
        assert len(lost_signals) == 1
        assert lost_signals[0]["name"] == "frozen-lease"
        assert not handle.held
        assert not backend.is_locked("frozen-lease")
    finally:
        backend.close()


#: The long hold's seconds: four times the 1 s lease in CI, ten under --soak.
LONG_HOLD = soak(4.0, 10.0)


def _renewed_holder(name: str, ready: Any, out: Any) -> None:
    try:
        with locks["redis"].lock(name, ttl=1, auto_renew=True) as handle:
            ready.set()
            time.sleep(LONG_HOLD)
            out.put(("held all along", handle.held))
        out.put(("released", "cleanly"))
    except Exception as exc:
        out.put(("released", repr(exc)))
    _done()


def test_watchdog_keeps_a_short_lease_for_a_long_hold(unique) -> None:
    require_redis()
    name = unique("renewed")
    _fork_ready()
    ready, out = FORK.Event(), FORK.Queue()
    proc = FORK.Process(target=_renewed_holder, args=(name, ready, out))
    proc.start()
    tries = taken = 0
    try:
        assert ready.wait(30)
        backend = locks["redis"]
        while proc.is_alive() and out.empty():
            other = backend.lock(name, ttl=30)
            tries += 1
            if other.acquire(blocking=False):
                taken += 1
                other.release()
            time.sleep(0.5)
        results = dict(out.get(timeout=30) for _ in range(2))
        proc.join(10)
    finally:
        if proc.is_alive():
            proc.kill()
    assert taken == 0
    assert tries >= LONG_HOLD / 0.5 * 0.75  # tried all along the hold
    assert results == {"held all along": True, "released": "cleanly"}
    assert proc.exitcode == 0
    free = locks["redis"].lock(name, ttl=30)
    assert free.acquire(blocking=False)  # released, not left to expire
    free.release()


# -- 6. abandoned attempts: cancelled, or given up on a server that did not answer ----


@pytest.mark.parametrize("alias", ["redis", "redis-cache", "redlock"])
def test_a_cancelled_aacquire_leaves_no_lock_behind(alias: str, unique) -> None:
    """A task is cancelled (``Task.cancel()``, what ``asyncio.wait_for`` and an ASGI
    server do) at a random point of its acquire, often while its attempt is in the
    server: what that attempt was granted is given back before the cancellation
    returns, and the name is free at once."""
    require_redis(redlock=alias == "redlock")
    backend = locks[alias]
    rng = random.Random(f"cancel {alias}")

    async def cancel_many() -> tuple[list[str], list[str]]:
        # A random number of event loop turns, not a timer: the loop's timers fire
        # 1 ms late at best (epoll), later than the reply on loopback. A cancellation
        # that lands as redis-py's write finishes is swallowed (asyncio.wait_for on
        # Python 3.11): that acquire completes and is released here.
        cancelled: list[str] = []
        left: list[str] = []
        index = 0
        while len(cancelled) < 40 and index < 2000:
            index += 1
            name = unique(f"cancelled-{index}")
            handle = backend.lock(name, ttl=30)
            task = asyncio.ensure_future(handle.aacquire(timeout=5))
            for _ in range(rng.randrange(12)):
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                cancelled.append(name)
                if backend.is_locked(name):
                    left.append(name)
            else:
                await handle.arelease()
        return cancelled, left

    cancelled, left = asyncio.run(cancel_many())
    assert len(cancelled) >= 40
    assert left == []
    for name in cancelled[-5:]:
        other = backend.lock(name, ttl=1)
        assert other.acquire(blocking=False)
        other.release()


def test_an_attempt_abandoned_on_a_frozen_server_grants_nobody_after_the_thaw(
    server: Server,
) -> None:
    """A waiter (ttl 30) gives up on a frozen server; the attempt written behind its
    ``BLPOP`` runs when the server resumes. It must not take the lock for 30 s: the
    next acquirer gets it when the holder's 1 s lease has ended."""
    backend = RedisBackend("own", {"LOCATION": server.url(), "TTL": 5})
    other = RedisBackend("other", {"LOCATION": server.url(), "TTL": 5})
    try:
        holder = backend.lock("thawed", ttl=1)
        assert in_thread(holder.acquire)  # another thread's (the newcomer's is this one)
        waiter = other.lock("thawed", ttl=30)
        failed: list[BaseException] = []

        def wait() -> None:
            try:
                waiter.acquire(timeout=5)
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)  # the waiter blocks in BLPOP, its next attempt written behind
        server.pause()
        try:
            thread.join(5 + READ_GRACE + 1)
            assert not thread.is_alive()
            assert len(failed) == 1 and isinstance(failed[0], BackendUnavailable)
            time.sleep(max(0.0, 1.2 - 0.3 - READ_GRACE))  # the holder's lease has ended
        finally:
            server.resume()
        newcomer = backend.lock("thawed", ttl=5)
        assert newcomer.acquire(timeout=2)  # not the waiter's 30 s
        newcomer.release()
    finally:
        server.resume()
        other.close()
        backend.close()


def test_a_waiter_on_a_frozen_server_returns_within_its_timeout_and_the_grace(
    server: Server,
) -> None:
    """A waiter gives up on a frozen server within its timeout plus READ_GRACE: the
    queue it leaves is not left on a new connection whose handshake waits redis-py's
    5 s socket timeout."""
    backend = RedisBackend("own", {"LOCATION": server.url(), "TTL": 5})
    try:
        holder = backend.lock("frozen-wait", ttl=30)
        assert in_thread(holder.acquire)
        freeze = threading.Timer(0.3, server.pause)
        freeze.start()
        waiter = backend.lock("frozen-wait", ttl=5)
        began = time.monotonic()
        try:
            with pytest.raises(BackendUnavailable):
                waiter.acquire(timeout=3)
            took = time.monotonic() - began
        finally:
            freeze.join()
            server.resume()
        record("frozen-server", "redis (wait)", worst_call_s=round(took, 2),
               bound_s=3 + READ_GRACE + 1)
        assert took < 3 + READ_GRACE + 1, took
        # The give-back thread takes the waiter out of the queue once the server answers.
        queue = backend.keys_for(backend.make_key("frozen-wait")).queue
        raw = redis.Redis(port=server.port)
        try:
            assert eventually(
                lambda: GIVE_BACKS.pending() == 0 and raw.zcard(queue) == 0, timeout=8
            )
        finally:
            raw.close()
    finally:
        server.resume()
        backend.close()


@pytest.mark.parametrize("connected", [False, True])
def test_a_first_acquire_on_a_frozen_server_returns_within_its_bound(
    server: Server, connected: bool
) -> None:
    """An alias' first acquire in a process asks the server whether it evicts keys
    (``INFO``). Against a frozen server that question waited for ever on the sync path
    (redis-py's ``info()`` waits for the socket's timeout: none by default); now it is
    bounded like the attempt: the acquire's timeout plus READ_GRACE, then
    BackendUnavailable. ``connected``: the pool holds a connection made before the
    freeze. Without one, the new connection's handshake (redis-py's, before our first
    command) is bounded by the URL's ``socket_timeout`` only (docs/faults.md): 2 s here."""
    url = server.url() if connected else server.url("socket_timeout=2")
    backend = RedisBackend("first", {"LOCATION": url, "TTL": 5})
    failed: list[BaseException] = []
    bound = 1 + READ_GRACE if connected else 2.0

    def acquire() -> None:
        try:
            backend.lock("frozen-first", ttl=5).acquire(timeout=1)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=acquire, daemon=True)
    try:
        if connected:
            assert not backend.is_locked("frozen-first")  # a connection, before the check
        assert not backend.server_checked
        server.pause()
        began = time.monotonic()
        thread.start()
        try:
            thread.join(bound + 3)
            assert not thread.is_alive()
        finally:
            server.resume()
        assert time.monotonic() - began < bound + 1
        assert len(failed) == 1 and isinstance(failed[0], BackendUnavailable), failed
    finally:
        thread.join(10)
        backend.close()
