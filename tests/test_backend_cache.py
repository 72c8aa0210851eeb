"""The cache backend (locks on a Django cache through its atomic add) against the real
memcached and Redis that scripts/test starts: the shipped contract on both, mutual
exclusion of forked processes, crashes, expiry, restarts, eviction and refusals."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core import checks
from django.core.cache import caches
from django.core.cache.backends.base import BaseCache
from django.test import Client, override_settings
from django.urls import reverse

from django_distlock import locks
from django_distlock.backends.acquisition import Acquisition
from django_distlock.backends.cache.memcached import server_ttl
from django_distlock.exceptions import (
    BackendUnavailable,
    LockConfigurationError,
    LockLost,
    UnsupportedOperation,
)
from django_distlock.handle import hold_of
from django_distlock.testing import HistoryRecorder, LockContract, check, load

from .conftest import (
    CACHE_ALIASES,
    DATABASES,
    in_thread,
    require_memcached,
    require_redis,
)
from .histories import FORK, done, fork_ready, run_forked
from .private_memcached import Memcached

pytestmark = pytest.mark.django_versions


def require(alias: str) -> None:
    """Fail (full run) or skip when the server behind ``alias`` is absent."""
    if alias == "cache-memcached":
        require_memcached()
    else:
        require_redis()


class TestCacheMemcached(LockContract):
    alias = "cache-memcached"

    @pytest.fixture(autouse=True)
    def _server(self) -> None:
        require_memcached()


class TestCacheRedis(LockContract):
    alias = "cache-redis"

    @pytest.fixture(autouse=True)
    def _server(self) -> None:
        require_redis()


# -- processes: a recorded history, a crash -------------------------------------------


def _recorded_rounds(alias: str, name: str, path: str, rounds: int, start: Any,
                     out: Any) -> None:
    start.wait()
    rec = HistoryRecorder(path)
    for _ in range(rounds):
        with rec.hold(locks[alias].lock(name, ttl=30, timeout=60)):
            time.sleep(0.002)
    rec.close()
    out.put(rounds)
    done()


@pytest.mark.parametrize("alias", CACHE_ALIASES)
def test_eight_processes_never_overlap(alias: str, unique, tmp_path: Path) -> None:
    """8 forked processes take one name 15 times each; the shipped checker finds no two
    valid holds overlapping in the recorded history."""
    require(alias)
    path = str(tmp_path / "history.jsonl")
    results, exitcodes = run_forked(_recorded_rounds, (alias, unique("mutex"), path, 15), 8)
    assert exitcodes == [0] * 8 and sum(results) == 8 * 15
    report = check(load(path))
    report.raise_if_bad()
    assert report.holds == 8 * 15 and report.processes == 8


def _hold_forever(alias: str, name: str, ready: Any) -> None:
    assert locks[alias].lock(name, ttl=1).acquire(timeout=10)
    ready.set()
    time.sleep(600)


@pytest.mark.parametrize("alias", CACHE_ALIASES)
def test_a_sigkilled_holder_frees_the_lock_at_its_ttl(alias: str, unique) -> None:
    """A 1 s lease of a killed holder: not free before 1 s, free within the cache's
    granularity (memcached: whole seconds, sent as ceil(ttl) + 1)."""
    require(alias)
    name = unique("crash")
    fork_ready()
    ready = FORK.Event()
    proc = FORK.Process(target=_hold_forever, args=(alias, name, ready))
    proc.start()
    assert ready.wait(30)
    granted = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    handle = locks[alias].lock(name, ttl=30)
    assert handle.acquire(blocking=False) is False
    assert handle.acquire(timeout=10) is True
    waited = time.monotonic() - granted
    handle.release()
    assert waited >= 0.9  # the TTL, from about the grant
    assert waited <= (3.2 if alias == "cache-memcached" else 1.6)


# -- an expired lease, taken by another owner -----------------------------------------


@pytest.mark.parametrize("alias", CACHE_ALIASES)
def test_an_expired_lease_retaken_is_neither_released_nor_extended(alias: str,
                                                                   unique) -> None:
    """The first owner's lease runs out on the server; a second owner takes the name.
    The first's release and extend, sent to the server (the acquisition's own calls,
    below the handle's local check), change nothing of the second's lock."""
    require(alias)
    backend, name = locks[alias], unique("expired")
    first = backend.lock(name, ttl=0.2)
    assert first.acquire()
    acquisition = hold_of(first).acquisition
    assert acquisition is not None
    time.sleep(0.3)  # past the lease on this process' clock (the server's may be later)
    second = backend.lock(name, ttl=30)
    assert second.acquire(timeout=10) is True  # after the first's lease ended
    assert acquisition.extend(30) is None
    assert acquisition.release((None, None, None)) is False
    with pytest.raises(LockLost):
        first.release()
    assert backend.is_locked(name)
    assert backend.lock(name).acquire(blocking=False) is False
    second.release()
    assert not backend.is_locked(name)


@pytest.mark.parametrize("alias", CACHE_ALIASES)
def test_force_release_by_owner_compares_the_holder(alias: str, unique) -> None:
    require(alias)
    backend, name = locks[alias], unique("force")
    handle = backend.lock(name, ttl=30)
    assert handle.acquire()
    mine = handle.owner_id
    other = "0" * 8 if mine != "0" * 8 else "f" * 8
    assert backend.force_release(name, owner=other) is False
    assert backend.is_locked(name)
    assert backend.force_release(name, owner=mine) is True
    assert not backend.is_locked(name)
    with pytest.raises(LockLost):
        handle.release()


# -- a grant rebuilt from its token (QueueOnce's worker) ------------------------------


def _rebuilt(alias: str, name: str, token: str) -> Acquisition:
    """An acquisition of ``name`` for the owner ``token``, never attempted: the grant
    rebuilt from its token alone, as QueueOnce's worker does with the enqueuer's."""
    backend = locks[alias]
    return backend.acquisition(backend.lock(name, ttl=30), token, False, None)


def _extend_and_release(alias: str, name: str, token: str, start: Any, out: Any) -> None:
    start.wait()
    try:
        acquisition = _rebuilt(alias, name, token)
        extended = acquisition.extend(60)
        out.put((extended is not None, locks[alias].is_locked(name),
                 acquisition.release((None, None, None))))
    except Exception as exc:  # told to the test, not lost in the child's stderr
        out.put(repr(exc))
    done()


@pytest.mark.parametrize("alias", CACHE_ALIASES)
def test_a_grant_rebuilt_from_its_token_in_another_process_extends_and_releases(
    alias: str, unique
) -> None:
    """A process that knows only a grant's token (no CAS value of its own on memcached)
    extends and releases it: the driver reads the item and compares the token."""
    require(alias)
    backend, name = locks[alias], unique("rebuilt")
    handle = backend.lock(name, ttl=30)
    assert handle.acquire()
    assert hold_of(handle).acquisition is not None
    token = hold_of(handle).acquisition.token
    results, exitcodes = run_forked(_extend_and_release, (alias, name, token), 1, timeout=30)
    assert exitcodes == [0] and results == [(True, True, True)]
    assert not backend.is_locked(name)
    with pytest.raises(LockLost):
        handle.release()


@pytest.mark.parametrize("alias", CACHE_ALIASES)
def test_a_grant_rebuilt_from_its_token_leaves_a_later_owner_s_lock(alias: str,
                                                                   unique) -> None:
    """The grant was freed and the name taken by another owner: the rebuilt grant
    neither extends nor releases that owner's lock (the token is compared)."""
    require(alias)
    backend, name = locks[alias], unique("rebuilt-retaken")
    first = backend.lock(name, ttl=30)
    assert first.acquire()
    assert hold_of(first).acquisition is not None
    token = hold_of(first).acquisition.token
    assert backend.force_release(name) is True
    second = backend.lock(name, ttl=30)
    assert second.acquire(blocking=False) is True
    rebuilt = _rebuilt(alias, name, token)
    assert rebuilt.extend(60) is None
    assert rebuilt.release((None, None, None)) is False
    assert backend.is_locked(name)
    second.release()
    assert not backend.is_locked(name)
    assert _rebuilt(alias, name, token).release((None, None, None)) is False  # no item


# -- memcached restarted, memcached evicting ------------------------------------------


@pytest.fixture
def private_memcached() -> Iterator[Memcached]:
    require_memcached()
    server = Memcached(megabytes=2)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def _on(server: Memcached) -> Any:
    """Settings with the alias ``cache-private`` locking on ``server``."""
    return override_settings(
        CACHES={**settings.CACHES, "private": server.settings()},
        DISTLOCK={**settings.DISTLOCK, "cache-private": {
            "BACKEND": "django_distlock.backends.cache.CacheBackend",
            "OPTIONS": {"CACHE": "private"},
        }},
    )


def test_memcached_restarted_while_held_loses_the_lock(private_memcached: Memcached,
                                                       unique) -> None:
    """memcached keeps nothing across a restart: while it is down every call raises
    BackendUnavailable; once back, the name is free to anyone, and the first holder
    learns it lost the lock at its release (LockLost)."""
    name = unique("restart")
    with _on(private_memcached):
        backend = locks["cache-private"]
        holder = backend.lock(name, ttl=60)
        assert holder.acquire()
        private_memcached.kill()
        with pytest.raises(BackendUnavailable):
            backend.is_locked(name)
        with pytest.raises(BackendUnavailable):
            holder.extend(60)
        private_memcached.start()
        other = backend.lock(name, ttl=60)

        def take() -> bool:  # the first call may still meet the old, dead socket
            deadline = time.monotonic() + 5
            while True:
                try:
                    return other.acquire(blocking=False)
                except BackendUnavailable:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)

        assert in_thread(take) is True  # while the first holder still holds it
        assert holder.held  # it cannot know until it asks the server
        with pytest.raises(LockLost):
            holder.release()
        assert backend.is_locked(name)
        in_thread(other.release)


def test_a_rebuilt_grant_on_a_stopped_memcached_raises_backend_unavailable(
    private_memcached: Memcached, unique
) -> None:
    """A grant rebuilt from its token meets a memcached that is down: its extend and its
    release raise BackendUnavailable, as the holder's own calls do."""
    name = unique("rebuilt-down")
    with _on(private_memcached):
        holder = locks["cache-private"].lock(name, ttl=60)
        assert holder.acquire()
        assert hold_of(holder).acquisition is not None
        token = hold_of(holder).acquisition.token
        private_memcached.kill()
        with pytest.raises(BackendUnavailable):
            _rebuilt("cache-private", name, token).extend(60)
        with pytest.raises(BackendUnavailable):
            _rebuilt("cache-private", name, token).release((None, None, None))


def test_memcached_evicting_grants_the_lock_twice(private_memcached: Memcached,
                                                  unique) -> None:
    """Under its memory limit (-m 2) memcached evicts the least recently used items,
    lock keys too: a held lock's key evicted by other writes is granted to a second
    owner while the first still holds it (a double grant, as docs/cache.md says). The
    first one's release then finds another item (LockLost), and leaves the second's."""
    name = unique("evicted")
    with _on(private_memcached):
        backend = locks["cache-private"]
        first = backend.lock(name, ttl=600)
        assert first.acquire()
        # Small items, in the lock item's slab class (memcached evicts per class), ten
        # times what 2 MB holds; the lock key is not read meanwhile (a read bumps it).
        filler, value = caches["private"], "x" * 32
        for batch in range(100):
            filler.set_many({f"filler:{batch}:{i}": value for i in range(1000)}, 600)
        assert not backend.is_locked(name), "the lock key was never evicted"
        second = backend.lock(name, ttl=600)
        assert in_thread(lambda: second.acquire(blocking=False)) is True
        assert first.held and second.held  # both believe they hold it
        with pytest.raises(LockLost):
            first.release()
        assert backend.is_locked(name)
        in_thread(second.release)


# -- caches that cannot hold a lock ---------------------------------------------------

REFUSED_CACHES = {
    "django.core.cache.backends.locmem.LocMemCache": "process-local",
    "django.core.cache.backends.db.DatabaseCache": "compare-and-delete",
    "django.core.cache.backends.filebased.FileBasedCache": "not atomically",
    "django.core.cache.backends.dummy.DummyCache": "stores nothing",
    "tests.test_backend_cache.UnknownCache": "does not know",
}


class UnknownCache(BaseCache):
    """A cache class the backend has never heard of."""


@pytest.mark.parametrize(("path", "why"), REFUSED_CACHES.items())
def test_a_cache_that_cannot_compare_is_refused(path: str, why: str, tmp_path: Path) -> None:
    """The system check says why (distlock.E030), and the first use refuses too."""
    cache = {"BACKEND": path, "LOCATION": str(tmp_path / "c") if "filebased" in path
             else "distlock_cache_table"}
    with override_settings(
        CACHES={**settings.CACHES, "unsafe": cache},
        DISTLOCK={**settings.DISTLOCK, "cache-unsafe": {
            "BACKEND": "django_distlock.backends.cache.CacheBackend",
            "OPTIONS": {"CACHE": "unsafe"},
        }},
    ):
        messages = [m for m in checks.run_checks(tags=["distlock"]) if m.obj == "cache-unsafe"]
        assert [m.id for m in messages] == ["distlock.E030"]
        assert why in messages[0].msg
        with pytest.raises(LockConfigurationError, match=why):
            locks["cache-unsafe"].lock("refused").acquire(blocking=False)
        with pytest.raises(LockConfigurationError, match=why):
            locks["cache-unsafe"].is_locked("refused")


def test_options_are_checked() -> None:
    cache = "django_distlock.backends.cache.CacheBackend"
    for params, problem in (
        ({"OPTIONS": {"CACHE": "nope"}}, "not a cache alias"),
        ({"OPTIONS": {"CACHE": 3}}, "must be a str"),
        ({"OPTIONS": {"SERVERS": 1}}, "unknown keys"),
        ({"LOCATION": "127.0.0.1:11211"}, "remove LOCATION"),
    ):
        with override_settings(DISTLOCK={**settings.DISTLOCK, "bad": {"BACKEND": cache,
                                                                      **params}}):
            messages = [m for m in checks.run_checks(tags=["distlock"]) if m.obj == "bad"]
            assert len(messages) == 1 and problem in messages[0].msg, messages


@pytest.mark.parametrize("alias", CACHE_ALIASES)
def test_flags_and_refusals(alias: str, unique) -> None:
    """No listing (said why), no fencing tokens, no kinds beyond the exclusive lock."""
    require(alias)
    backend = locks[alias]
    with pytest.raises(UnsupportedOperation, match="cannot list its keys"):
        backend.held_locks()
    with backend.lock(unique(), ttl=5) as handle:
        assert handle.fencing_token is None


def test_memcached_ttls_are_whole_seconds_rounded_up(unique) -> None:
    """A 1.2 s lease is sent as 3 s (ceil + 1, for the once-a-second clock); a lease
    of 30 days (plus the rounding, past memcached's limit) is refused."""
    require_memcached()
    backend = locks["cache-memcached"]
    assert server_ttl(1.2) == 3 and server_ttl(1) == 2 and server_ttl(0.3) == 2
    with pytest.raises(UnsupportedOperation, match="30 days"):
        backend.lock(unique(), ttl=30 * 24 * 3600).acquire()


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_the_admin_names_the_alias_and_why_it_cannot_list() -> None:
    require_memcached()
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "boss@example.com", "pw"))
    page = client.get(reverse("admin:django_distlock_held_locks")).content.decode()
    assert ("cache-memcached (Django cache) cannot list its locks. "
            '<span class="distlock-unlisted-reason">A cache cannot list its keys') in page
