"""The Redis backend against the real Redis (and Redis Cluster) that scripts/test starts:
the shipped contract through a URL and a cluster; round trips, scripts, names, listing,
reentrancy, fairness, configuration. Through Django's caches (django-redis and
RedisCache), and the system checks: ``test_backend_redis_django.py``."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.test import override_settings
from redis.cluster import key_slot

from django_distlock import locks
from django_distlock.backends.redis import RedisBackend
from django_distlock.backends.redis.acquisition import REFUSED
from django_distlock.exceptions import (
    InvalidBackendOptions,
    InvalidLockName,
    LockLost,
    LockNotHeld,
    UnsupportedOperation,
)
from django_distlock.testing import LockContract

from .conftest import REDIS_ALIASES, eventually, in_thread, require_redis

pytestmark = pytest.mark.second_env  # CONTRIBUTING.md, the tiers

URL = os.environ.get("DISTLOCK_REDIS_URL", "")


class RedisContract(LockContract):
    @pytest.fixture(autouse=True)
    def _redis(self) -> None:
        require_redis()


class TestRedisURL(RedisContract):
    alias = "redis"


class TestRedisUnfair(RedisContract):
    alias = "redis-unfair"


class TestRedisDecodedResponses(RedisContract):
    alias = "redis-decoded"  # the URL sets decode_responses=True: replies are str


class TestRedisCluster(LockContract):
    alias = "redis-cluster"

    @pytest.fixture(autouse=True)
    def _redis(self) -> None:
        require_redis(cluster=True)


@pytest.fixture
def backend() -> RedisBackend:
    require_redis()
    backend = locks["redis"]
    assert isinstance(backend, RedisBackend)
    return backend


@pytest.fixture
def raw() -> Iterator[redis.Redis]:
    require_redis()
    client = redis.Redis.from_url(URL)
    yield client
    client.close()


class Sent:
    """Counts the commands a client writes to its sockets (each one round trip here:
    no pipelining); names each by its first word."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.commands: list[bytes] = []
        real = redis.connection.AbstractConnection.send_packed_command

        def send_packed_command(conn: Any, command: Any, *args: Any, **kwargs: Any) -> None:
            data = command if isinstance(command, bytes) else b"".join(command)
            self.commands.append(data.split(b"\r\n")[2].upper())
            real(conn, command, *args, **kwargs)

        monkeypatch.setattr(
            redis.connection.AbstractConnection, "send_packed_command", send_packed_command
        )

    def take(self) -> list[bytes]:
        taken, self.commands = self.commands, []
        return taken


# -- round trips and scripts --------------------------------------------------------


def test_acquire_release_and_extend_are_one_evalsha_each(
    backend: RedisBackend, unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = backend.lock(unique(), ttl=10)
    with backend.lock(unique(), ttl=10):  # first use of the alias in the process (the
        pass  # server's clock, its eviction policy) is another test's; run alone too
    backend.redis.sync().script_flush()
    sent = Sent(monkeypatch)
    assert handle.acquire()
    assert sent.take() == [b"EVALSHA", b"EVAL"]  # NOSCRIPT: one EVAL, which loads it
    handle.extend(10)
    handle.release()
    assert sent.take() == [b"EVALSHA", b"EVAL"] * 2  # each script loads once
    assert handle.acquire()
    assert sent.take() == [b"EVALSHA"]
    handle.extend(20)
    assert sent.take() == [b"EVALSHA"]
    handle.release()
    assert sent.take() == [b"EVALSHA"]


def test_a_flushed_script_cache_is_reloaded_transparently(
    backend: RedisBackend, raw: redis.Redis, unique
) -> None:
    handle = backend.lock(unique(), ttl=10)
    assert handle.acquire()
    raw.script_flush()
    handle.extend(10)  # NOSCRIPT -> EVAL, once
    raw.script_flush()
    other = backend.lock(handle.name, timeout=0.2)
    assert in_thread(other.acquire) is False  # never a double grant
    raw.script_flush()
    handle.release()
    assert not backend.is_locked(handle.name)


def test_a_waiter_woken_after_a_script_flush_is_granted(
    backend: RedisBackend, raw: redis.Redis, unique
) -> None:
    """The attempt written behind a waiter's BLPOP meets NOSCRIPT when the scripts
    were flushed meanwhile: it is made again with EVAL, and the waiter gets the lock."""
    name = unique()
    holder = backend.lock(name, ttl=10)
    assert holder.acquire()
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(backend.lock(name).acquire(timeout=10)))
    thread.start()
    assert eventually(lambda: backend.held_locks(prefix=name).locks[0].waiters == 1)
    raw.script_flush()
    began = time.monotonic()
    holder.release()
    thread.join(10)
    assert got == [True]
    assert time.monotonic() - began < 0.9  # woken by the release, not the heartbeat
    assert backend.is_locked(name)
    raw.delete(backend.keys_for(backend.make_key(name)).lock)


def test_fencing_tokens_grow_and_survive_the_counter_being_lost(
    backend: RedisBackend, raw: redis.Redis, unique
) -> None:
    name = unique()
    tokens = []
    for _ in range(3):
        with backend.lock(name) as handle:
            tokens.append(handle.fencing_token)
    keys = backend.keys_for(backend.make_key(name))
    raw.delete(keys.seq)  # as after a restart without persistence
    with backend.lock(name) as handle:
        tokens.append(handle.fencing_token)
    assert tokens == sorted(set(tokens))
    assert tokens[-1] > time.time() * 1e6 - 60e6  # restarted from the server clock (µs)


def test_holder_metadata_comes_from_the_server_clock(backend: RedisBackend, unique) -> None:
    handle = backend.lock(unique(), ttl=30)
    with handle:
        info = next(i for i in backend.held_locks(prefix=handle.name) if i.name == handle.name)
        owner = handle.owner_id
    assert owner is not None and info.owner == owner  # shown short, never the token
    assert info.pid == os.getpid() and info.host == handle.holder.host
    assert info.thread == handle.holder.thread
    assert info.fencing_token == handle.fencing_token
    assert abs((info.expires_at - info.acquired_at).total_seconds() - 30) < 2


# -- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["{tag}", "a{b}c:{d}", "}{", "{}", ":", "a:b:c", "ünï ✓", "x" * (1 << 20)]
)
def test_odd_names_keep_all_their_keys_in_one_cluster_slot(
    backend: RedisBackend, unique, name: str
) -> None:
    full = unique() + name
    keys = backend.keys_for(backend.make_key(full))
    slots = {key_slot(k.encode()) for k in (keys.lock, keys.queue, keys.waiters, keys.seq)}
    slots.add(key_slot((keys.signal + "0" * 32).encode()))
    assert len(slots) == 1
    assert all(k.startswith("u:distlock{") for k in keys[:5])  # under the alias' KEY_PREFIX
    with backend.lock(full, ttl=10) as handle:
        assert backend.is_locked(full)
        assert in_thread(lambda: backend.lock(full).acquire(blocking=False)) is False
    assert not handle.held and not backend.is_locked(full)


def test_a_nul_in_a_name_is_a_clear_error_before_any_command(
    backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(monkeypatch)
    with pytest.raises(InvalidLockName, match="control characters"):
        backend.lock("a\x00b")
    assert sent.take() == []


def test_a_megabyte_name_is_listed_shortened(backend: RedisBackend, unique) -> None:
    name = unique("big") + "x" * (1 << 20)
    handle = backend.lock(name)
    with pytest.raises(LockLost) as lost, handle:
        page = backend.held_locks(prefix=name[:20])
        (info,) = [i for i in page if i.name.startswith(name[:20])]
        assert "…[sha256:" in info.name
        assert backend.force_release(name) is True
    assert len(str(lost.value)) < 300  # the error names the lock shortened


# -- listing ---------------------------------------------------------------------------


def test_listing_drops_ended_leases_and_pages_by_the_index(
    backend: RedisBackend, raw: redis.Redis, unique
) -> None:
    prefix = unique("list") + "/"
    short = [backend.lock(f"{prefix}{i:03}", ttl=0.2) for i in range(5)]
    long = [backend.lock(f"{prefix}{i:03}", ttl=30) for i in range(5, 12)]
    for handle in short + long:
        assert handle.acquire()
    time.sleep(0.3)
    names, cursor, pages = [], None, 0
    while True:
        page = backend.held_locks(prefix=prefix, limit=3, cursor=cursor)
        names += [info.name for info in page]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert names == [h.name for h in long]
    index = backend.keys_for(backend.make_key(prefix)).listing
    members = raw.zrangebylex(index, b"[" + prefix.encode(), b"[" + prefix.encode() + b"\xff")
    assert len(members) == 7  # the ended leases' entries were dropped
    for handle in long:
        handle.release()
    assert raw.zrangebylex(index, b"[" + prefix.encode(), b"[" + prefix.encode() + b"\xff") == []


def test_an_alias_without_listing_writes_no_index_entry_and_says_it_cannot_list(
    raw: redis.Redis, unique
) -> None:
    require_redis()
    unlisted, listed = locks["redis-unfair"], locks["redis"]
    name = unique("unlisted")
    for backend in (unlisted, listed):
        keys = backend.keys_for(backend.make_key(name))
        with backend.lock(name, ttl=10) as lease:
            entered = raw.zscore(keys.listing, keys.member) is not None
            assert entered is (backend is listed)
            assert backend.is_locked(name) and lease.fencing_token
    for call in (lambda: unlisted.held_locks(prefix=name), lambda: unlisted.count_held()):
        with pytest.raises(UnsupportedOperation, match="LISTING"):
            call()
    assert not type(unlisted).supports_listing and type(listed).supports_listing
    assert unlisted.force_release(name) is False  # by name it still works (nothing held)


def test_a_count_reads_the_index_a_chunk_per_script(
    backend: RedisBackend, unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An uncapped count of a million locks was one script holding Redis 1.2 s.
    from django_distlock.backends.base import HeldCount
    from django_distlock.backends.redis import backend as module

    prefix = unique("chunks") + "/"
    held = [backend.lock(f"{prefix}{i:03}", ttl=30) for i in range(120)]
    for handle in held:
        assert handle.acquire()
    replies: list[Any] = []
    run = backend.redis.run

    def spy(script: Any, keys: Any, args: Any) -> Any:
        reply = run(script, keys, args)
        if script.name == "count":
            replies.append(reply)
        return reply

    monkeypatch.setattr(module, "COUNT_CHUNK", 50)
    monkeypatch.setattr(backend.redis, "run", spy)
    try:
        assert backend.count_held(prefix=prefix) == HeldCount(120, True)
        assert [int(reply[3]) for reply in replies] == [50, 50, 20]  # entries read per call
        replies.clear()
        assert backend.count_held(prefix=prefix, limit=70) == HeldCount(70, False)
        assert len(replies) == 2
    finally:
        for handle in held:
            handle.release()


def test_listing_cost_grows_with_the_page_not_with_the_keys(
    backend: RedisBackend, raw: redis.Redis, unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = unique("many") + "/"
    pipe = raw.pipeline(transaction=False)
    keys = backend.keys_for(backend.make_key(prefix))
    for i in range(2000):  # other holders' locks, written as the acquire script writes them
        member = f"{prefix[len('') :]}{i:05}"
        stored = keys.lock[: -len(keys.member)] + member
        pipe.set(stored, "0" * 32 + " 1 1 1 h 1 t", px=60000)
        pipe.zadd(keys.listing, {member: 0})
    pipe.execute()
    sent = Sent(monkeypatch)
    page = backend.held_locks(prefix=prefix, limit=10)
    assert [i.name for i in page] == [f"{prefix}{i:05}" for i in range(10)]
    assert sent.take() == [b"EVALSHA"]  # one script per index tag, no KEYS or SCAN


# -- reentrancy --------------------------------------------------------------------------


def test_reentrant_acquisitions_are_counted_with_no_round_trip(
    backend: RedisBackend, unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handle layer counts them (as on every backend): one grant, one release."""
    handle = backend.lock(unique(), reentrant=True, ttl=10)
    with backend.lock(unique("warm")):  # connected, acquire script loaded
        pass
    sent = Sent(monkeypatch)
    assert handle.acquire() and handle.acquire(blocking=False) and handle.acquire()
    assert sent.take() == [b"EVALSHA"]
    token = handle.fencing_token
    handle.release()
    handle.release()
    assert sent.take() == []  # the inner releases count down in the process
    assert backend.is_locked(handle.name) and handle.held
    assert in_thread(lambda: backend.lock(handle.name).acquire(blocking=False)) is False
    sent.take()
    handle.release()
    assert sent.take() == [b"EVALSHA"]
    assert not backend.is_locked(handle.name) and not handle.held
    assert token is not None
    with pytest.raises(LockNotHeld):
        handle.release()


def test_handles_sharing_an_owner_share_the_lock_in_any_thread(
    backend: RedisBackend, unique
) -> None:
    name = unique()
    first = backend.lock(name, reentrant=True, owner="job-17")
    assert first.acquire()
    second = backend.lock(name, reentrant=True, owner="job-17", timeout=1)
    assert in_thread(second.acquire) is True  # same owner: counted, not waited for
    stranger = backend.lock(name, reentrant=True, owner="job-18")
    assert in_thread(lambda: stranger.acquire(blocking=False)) is False
    in_thread(second.release)
    assert backend.is_locked(name)
    first.release()
    assert not backend.is_locked(name)


def test_reentrancy_can_be_the_alias_default() -> None:
    require_redis()
    with override_settings(
        DISTLOCK={
            "default": {
                "BACKEND": "django_distlock.backends.redis.RedisBackend",
                "LOCATION": URL,
                "REENTRANT": True,
            }
        }
    ):
        assert locks["default"].lock("x").options.reentrant is True
        assert locks["default"].lock("x", reentrant=False).options.reentrant is False
        assert locks["default"].read_lock("x").options.reentrant is False  # not for kinds


def test_owner_without_reentrancy_and_reentrancy_elsewhere_are_errors(
    backend: RedisBackend,
) -> None:
    with pytest.raises(ValueError, match="reentrant=True"):
        backend.lock("x", owner="me")
    with pytest.raises(ValueError, match="owner"):
        backend.lock("x", reentrant=True, owner="")
    with pytest.raises(UnsupportedOperation, match="supports_shared_owner"):
        locks["locmem"].lock("x", reentrant=True, owner="me")
    locks["locmem"].lock("x", reentrant=True)  # reentrancy itself: every backend


# -- waiting: woken by the release, fair, bounded ----------------------------------------


def test_a_waiter_is_woken_by_the_release_not_by_a_poll(
    backend: RedisBackend, unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    granted: dict[str, float] = {}

    def wait() -> None:
        handle = backend.lock(name, ttl=30, timeout=20)
        assert handle.acquire()
        granted["at"] = time.monotonic()
        handle.release()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.35)  # inside the waiter's first block (heartbeat 1 s, holder ttl 30 s)
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert granted["at"] - released < 0.2  # woken by the release, not at the heartbeat


@pytest.mark.parametrize("alias", ["redis", "redis-decoded"])
def test_an_async_waiter_is_woken_by_the_release(alias: str, unique) -> None:
    require_redis()
    backend = locks[alias]
    name = unique()

    async def main() -> float:
        holder = backend.lock(name, ttl=30)
        assert await holder.aacquire()
        waiter = backend.lock(name, ttl=30, timeout=20)

        async def wait() -> float:
            started = time.monotonic()
            assert await waiter.aacquire()
            return time.monotonic() - started

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.3)
        await holder.arelease()
        waited = await task
        await waiter.arelease()
        return waited

    assert asyncio.run(main()) < 0.8


def test_waiting_threads_are_served_in_arrival_order(backend: RedisBackend, unique) -> None:
    name = unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    order: list[int] = []
    threads = []
    for index in range(5):

        def wait(index: int = index) -> None:
            handle = backend.lock(name, ttl=30, timeout=30)
            assert handle.acquire()
            order.append(index)
            time.sleep(0.01)
            handle.release()

        threads.append(threading.Thread(target=wait))
        threads[-1].start()
        time.sleep(0.1)  # arrive one after the other
    holder.release()
    for thread in threads:
        thread.join(30)
    assert order == [0, 1, 2, 3, 4]


def test_a_waiter_that_gives_up_leaves_the_queue(
    backend: RedisBackend, raw: redis.Redis, unique
) -> None:
    name = unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    started = time.monotonic()
    assert in_thread(lambda: backend.lock(name, timeout=0.25).acquire()) is False
    assert time.monotonic() - started < 0.25 + 0.1  # within its timeout
    keys = backend.keys_for(holder.key)
    assert raw.zcard(keys.queue) == 0 and raw.hlen(keys.waiters) == 0
    holder.release()
    assert backend.lock(name).acquire(blocking=False)  # nobody ahead


def test_a_waiter_behind_a_dead_head_is_served_after_the_heads_heartbeat(
    backend: RedisBackend, raw: redis.Redis, unique
) -> None:
    name = unique()
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    keys = backend.keys_for(holder.key)
    # A waiter that died queued (its process killed): its entry stays until it goes stale.
    now_ms = int(raw.time()[0] * 1000)
    raw.zadd(keys.queue, {"d" * 32: 1})
    raw.hset(keys.waiters, "d" * 32, f"{now_ms + 800} L {keys.signal}{'d' * 32}")
    holder.release()
    handle = backend.lock(name, timeout=5)
    assert in_thread(handle.acquire) is True
    stale_at = datetime.fromtimestamp((now_ms + 800) / 1000, UTC)
    assert handle.acquired_at is not None
    assert stale_at <= handle.acquired_at < stale_at + timedelta(seconds=1.5)
    in_thread(handle.release)


# -- fork, configuration --------------------------------------------------------------------


def test_a_forked_child_cannot_release_or_extend_its_parents_lease(
    backend: RedisBackend, unique
) -> None:
    handle = backend.lock(unique(), ttl=30)
    assert handle.acquire()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            for call in (handle.release, handle.extend):
                try:
                    call()
                    code = 1
                except LockNotHeld:
                    pass
            if handle.held or not backend.is_locked(handle.name):  # fresh connections work
                code = 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert handle.held and backend.is_locked(handle.name)
    handle.release()


def test_a_forked_child_and_its_parent_never_share_a_kept_connection(
    backend: RedisBackend, unique
) -> None:
    """The hot path keeps connections between calls; a child forked after them must not
    write on its parent's sockets (the replies would cross): both lock away at once."""
    names = unique(), unique()
    for name in names:  # the parent now keeps a connection or two
        with backend.lock(name, ttl=10):
            pass
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for _ in range(300):
                with backend.lock(names[1], ttl=10) as lease:
                    if lease.name != names[1] or not lease.held:
                        code = 1
        except BaseException:
            code = 2
        os._exit(code)
    for _ in range(300):
        with backend.lock(names[0], ttl=10) as lease:
            assert lease.held
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "neither"),
        ({"LOCATION": "redis://x", "OPTIONS": {"CACHE": "c"}}, "both"),
        ({"LOCATION": "http://x"}, "rediss:// or unix:// URL"),
        ({"LOCATION": "redis://x", "OPTIONS": {"FAIR": "yes"}}, "FAIR"),
        ({"LOCATION": "redis://x", "OPTIONS": {"LISTING": 0}}, "LISTING"),
        ({"LOCATION": "redis://x", "OPTIONS": {"SHARDS": 0}}, "SHARDS"),
        ({"LOCATION": "redis://x", "OPTIONS": {"NOPE": 1}}, "unknown keys"),
        ({"LOCATION": "redis://x", "KEY_PREFIX": "a{b}"}, "KEY_PREFIX"),
        ({"OPTIONS": {"CACHE": "c", "CLUSTER": True}}, "CLUSTER"),
    ],
)
def test_bad_options_are_clear_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidBackendOptions, match=message):
        RedisBackend("r", params)


def test_an_attempt_run_after_its_not_after_changes_nothing(
    backend: RedisBackend, raw: redis.Redis, unique
) -> None:
    """The acquire script refuses to run later than the server time its client still
    listens until (a frozen server thawed after the client gave up): no grant, no queue
    entry; before that time it grants."""
    name = unique("not-after")
    calls = backend.calls_for(backend.make_key(name))
    seconds, micros = raw.time()
    now = seconds * 1000 + micros // 1000
    args = ("a" * 32, 30000, "host 1 thread", "fij", "L " + calls.keys.signal + "a" * 32)
    assert backend.redis.call(calls.acquire, (*args, now - 1000), 1.0) == [0, REFUSED]
    assert raw.exists(calls.keys.lock, calls.keys.queue, calls.keys.waiters) == 0
    reply = backend.redis.call(calls.acquire, (*args, now + 60_000), 1.0)
    assert reply[0] == 1
    assert backend.is_locked(name)
    assert backend.redis.call(calls.release, ("a" * 32,), 1.0) == 1


def test_a_stale_clock_offset_costs_no_miss(backend: RedisBackend, unique) -> None:
    """An offset that puts the server's clock a minute early gets the attempt refused;
    the attempt measures the clock again and asks once more: no spurious miss."""
    backend.redis.measure(1.0)
    assert backend.redis.offset is not None
    for asynchronous in (False, True):
        backend.redis.offset -= 60_000
        handle = backend.lock(unique(f"stale-offset-{asynchronous}"), ttl=10)
        if asynchronous:
            assert asyncio.run(handle.aacquire(blocking=False))
        else:
            assert handle.acquire(blocking=False)
        handle.release()
        assert backend.redis.server_time(time.monotonic()) > 0


def test_a_lost_lease_cannot_release_the_next_holders_lock(backend: RedisBackend, unique) -> None:
    name = unique()
    first = backend.lock(name, ttl=0.2)
    assert first.acquire()
    time.sleep(0.3)
    second = backend.lock(name, ttl=30)
    assert in_thread(lambda: second.acquire(blocking=False)) is True
    with pytest.raises(LockLost):
        first.extend()
    with pytest.raises(LockNotHeld):
        first.release()
    assert eventually(lambda: backend.is_locked(name))
    in_thread(second.release)


@pytest.mark.parametrize("alias", REDIS_ALIASES)
def test_every_alias_serves_asyncio_tasks_natively(alias: str, unique) -> None:
    require_redis()
    backend = locks[alias]
    name = unique()
    active: list[int] = []
    overlaps = 0

    async def worker(index: int) -> None:
        nonlocal overlaps
        for _ in range(5):
            async with backend.lock(name, ttl=10, timeout=20):
                active.append(index)
                if len(active) > 1:
                    overlaps += 1
                await asyncio.sleep(0.001)
                active.remove(index)

    async def main() -> None:
        await asyncio.gather(*(worker(i) for i in range(20)))

    asyncio.run(main())
    assert overlaps == 0


def test_a_cluster_spreads_locks_over_its_masters_and_lists_them_all(unique) -> None:
    require_redis(cluster=True)
    backend = locks["redis-cluster"]
    assert isinstance(backend, RedisBackend)
    prefix = unique("spread") + "/"
    names = [f"{prefix}{i:02}" for i in range(40)]
    handles = [backend.lock(name, ttl=30) for name in names]
    for handle in handles:
        assert handle.acquire()
    client = backend.redis.sync()
    masters = {client.get_node_from_key(backend.keys_for(h.key).lock).name for h in handles}
    assert len(masters) == 3  # the tags spread the locks over every master
    listed, cursor = [], None
    while True:
        page = backend.held_locks(prefix=prefix, limit=7, cursor=cursor)
        listed += [info.name for info in page]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert listed == names
    for handle in handles:
        keys = backend.keys_for(handle.key)
        assert len({key_slot(k.encode()) for k in keys[:5]}) == 1
        handle.release()
    assert backend.held_locks(prefix=prefix).locks == []


@pytest.mark.parametrize("alias", ["redis", "redis-cache", "redis-cluster"])
def test_a_thousand_tasks_in_one_loop_wait_for_a_pooled_connection(alias: str, unique) -> None:
    """More tasks than the async pool has connections (redis-py's default is 100) all
    take their turn: a task waits for a free connection, not MaxConnectionsError."""
    require_redis(cluster=alias == "redis-cluster")
    backend = locks[alias]
    names = [unique() for _ in range(10)]
    active: dict[str, int] = dict.fromkeys(names, 0)
    served = overlaps = 0

    async def task(index: int) -> None:
        nonlocal served, overlaps
        name = names[index % len(names)]
        async with backend.lock(name, ttl=30, timeout=60):
            active[name] += 1
            overlaps += active[name] > 1
            await asyncio.sleep(0)
            active[name] -= 1
            served += 1

    async def main() -> None:
        await asyncio.gather(*(task(i) for i in range(1000)))

    asyncio.run(main())
    assert (served, overlaps) == (1000, 0)


def test_connections_the_server_closed_between_calls_are_replaced(
    backend: RedisBackend, raw: redis.Redis, unique
) -> None:
    """The hot path keeps its connections out of the pool between calls; one the server
    closed meanwhile (an idle timeout, CLIENT KILL, a restart) is replaced, not an error."""
    name = unique()
    handle = backend.lock(name, ttl=10)
    assert handle.acquire()
    raw.client_kill_filter(_type="normal", skipme=True)  # every other client's connection
    handle.release()  # no BackendUnavailable, no LockLost
    assert not backend.is_locked(name)
    assert handle.acquire(blocking=False)
    raw.client_kill_filter(_type="normal", skipme=True)
    handle.extend(10)
    handle.release()
    assert not backend.is_locked(name)


def test_a_wait_under_a_short_socket_timeout_never_reads_past_it(unique) -> None:
    """Redis ends a BLPOP up to one timer tick (100 ms) after its timeout: a block must
    stay that much shorter than the socket timeout, or the wait's read times out
    (BackendUnavailable) instead of the acquire returning False at its timeout."""
    require_redis()
    backend = RedisBackend("short", {"LOCATION": URL + "?socket_timeout=0.3", "TTL": 30})
    try:
        name = unique()
        holder = backend.lock(name)
        assert holder.acquire()

        def wait() -> float:
            began = time.monotonic()
            assert backend.lock(name).acquire(timeout=1.2) is False
            return time.monotonic() - began

        for _ in range(3):
            assert in_thread(wait) < 1.3
        holder.release()
    finally:
        backend.close()
