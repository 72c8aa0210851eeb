"""``django_distlock.caching``: the fill's rules in one process (the process-local lock,
or a holder in another process). The fenced write on every cache kind's real server:
test_caching_stores.py (it reads Django's cache internals: every Django env runs it);
the stampedes of OS processes on every lock backend: test_caching_processes.py."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from django.core.cache import caches
from django.core.cache.backends.base import InvalidCacheBackendError
from django.test import override_settings

from django_distlock import caching, locks
from django_distlock.caching import entry, stores
from django_distlock.exceptions import BackendUnavailable, InvalidLockAlias, LockTimeout
from django_distlock.testing import backend_unavailable, hold_elsewhere

from .conftest import LIBRARY_DB, require_redis

pytestmark = LIBRARY_DB

LOCK = "locmem"


class Builder:
    """A builder that counts its calls and returns ``value`` (or raises ``error``)."""

    def __init__(self, value: object = "built", error: Exception | None = None,
                 sleep: float = 0.0) -> None:
        self.value, self.error, self.sleep = value, error, sleep
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        if self.sleep:
            time.sleep(self.sleep)
        if self.error is not None:
            raise self.error
        return self.value


def held_in_thread(name: str, using: str = LOCK) -> tuple[threading.Event, threading.Thread]:
    """Hold ``name`` in another thread until the returned event is set."""
    taken, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        with locks[using].lock(name, ttl=30):
            taken.set()
            let_go.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(10)
    return let_go, thread


def lock_name(key: str, cache: str = "default") -> str:
    return f"cache:{cache}:{caches[cache].version}:{key}"


# -- the fill ---------------------------------------------------------------------


def test_a_miss_builds_once_then_hits(unique) -> None:
    key, build = unique("k"), Builder()
    assert caching.get_or_set(key, build, 60, using=LOCK) == "built"
    assert caching.get_or_set(key, build, 60, using=LOCK) == "built"
    assert build.calls == 1
    assert not locks[LOCK].is_locked(lock_name(key))


def test_a_value_default_and_a_plain_cached_value(unique) -> None:
    key = unique("k")
    assert caching.get_or_set(key, 5, 60, using=LOCK) == 5
    caches["default"].set(key + ":plain", "set by hand")
    assert caching.get_or_set(key + ":plain", Builder(), 60, using=LOCK) == "set by hand"


def test_the_entry_carries_freshness_duration_and_the_grants_token(unique) -> None:
    key = unique("k")
    before = time.time()
    caching.get_or_set(key, Builder(sleep=0.05), 60, using=LOCK)
    stored = caches["default"].get(key)
    assert entry.is_entry(stored)
    _, value, fresh_until, delta, alias, token = stored
    assert value == "built" and before + 60 <= fresh_until <= time.time() + 60
    assert delta >= 0.05 and alias == LOCK and isinstance(token, int)


def test_a_builder_that_raises_stores_nothing_and_frees_the_lock(unique) -> None:
    key = unique("k")
    with pytest.raises(ZeroDivisionError):
        caching.get_or_set(key, Builder(error=ZeroDivisionError()), 60, using=LOCK)
    assert not locks[LOCK].is_locked(lock_name(key))
    assert caches["default"].get(key) is None
    assert caching.get_or_set(key, Builder("second"), 60, using=LOCK) == "second"


def test_stale_is_served_at_once_while_another_rebuilds(unique) -> None:
    key = unique("k")
    caching.get_or_set(key, Builder("old"), 0.05, using=LOCK, stale=30, beta=0)
    time.sleep(0.1)
    let_go, thread = held_in_thread(lock_name(key))  # "another caller rebuilding"
    try:
        build = Builder("new")
        assert caching.get_or_set(key, build, 0.05, using=LOCK, stale=30, beta=0) == "old"
        assert build.calls == 0
    finally:
        let_go.set()
        thread.join()
    time.sleep(0.05)  # past this process' note that it is being rebuilt (10 ms here)
    # The lock free, the first caller after the expiry rebuilds and gets the new value.
    assert caching.get_or_set(key, Builder("new"), 60, using=LOCK, stale=30) == "new"


def test_a_caller_that_found_the_rebuild_busy_does_not_ask_again_at_once(unique) -> None:
    from django_distlock.signals import lock_not_acquired

    key = unique("k")
    caching.get_or_set(key, Builder("old", sleep=0.3), 0.05, using=LOCK, stale=30, beta=0)
    time.sleep(0.1)
    misses = []

    def missed(**kwargs: object) -> None:
        misses.append(kwargs["name"])

    lock_not_acquired.connect(missed)
    let_go, thread = held_in_thread(lock_name(key))
    try:
        for _ in range(5):  # within the last build's 0.3 s: one try of the lock, no more
            assert caching.get_or_set(key, Builder("new"), 0.05, using=LOCK, stale=30,
                                      beta=0) == "old"
        assert misses == [lock_name(key)]
        time.sleep(0.35)
        assert caching.get_or_set(key, Builder("new"), 0.05, using=LOCK, stale=30,
                                  beta=0) == "old"
        assert misses == [lock_name(key)] * 2  # the note ran out: it tried again
    finally:
        lock_not_acquired.disconnect(missed)
        let_go.set()
        thread.join()


def test_past_the_stale_window_callers_wait_and_build(unique) -> None:
    key = unique("k")
    caching.get_or_set(key, Builder("old"), 0.05, using=LOCK, stale=0.05, beta=0)
    time.sleep(0.2)
    assert caching.get_or_set(key, Builder("new"), 60, using=LOCK) == "new"


def test_stale_needs_a_timeout_and_refuses_nonsense(unique) -> None:
    with pytest.raises(ValueError, match="stale needs a timeout"):
        caching.get_or_set(unique("k"), 1, None, using=LOCK, stale=5)
    with pytest.raises(ValueError, match="stale"):
        caching.get_or_set(unique("k"), 1, 5, using=LOCK, stale=-1)


@pytest.fixture
def median_draw(monkeypatch) -> None:
    """XFetch's uniform draw fixed at 0.5 (-ln(u) = 0.69): the test decides what is due."""
    monkeypatch.setattr(entry, "random", SimpleNamespace(random=lambda: 0.5))


def test_early_refresh_rebuilds_a_fresh_value_when_due(unique, median_draw) -> None:
    key = unique("k")
    # 0.2 s * 50 * 0.69 = 6.9 s reaches past the 1 s of freshness: due.
    caching.get_or_set(key, Builder("first", sleep=0.2), 1, using=LOCK, beta=50)
    build = Builder("early")
    assert caching.get_or_set(key, build, 1, using=LOCK, beta=50) == "early"
    assert build.calls == 1
    # beta=0: never early.
    key2 = unique("k2")
    caching.get_or_set(key2, Builder("first", sleep=0.2), 1, using=LOCK, beta=0)
    never = Builder("early")
    assert caching.get_or_set(key2, never, 1, using=LOCK, beta=0) == "first"
    assert never.calls == 0


def test_early_refresh_does_not_wait_for_a_busy_lock(unique, median_draw) -> None:
    key = unique("k")
    caching.get_or_set(key, Builder("first", sleep=0.2), 1, using=LOCK, beta=50)
    let_go, thread = held_in_thread(lock_name(key))
    try:
        build = Builder("early")
        assert caching.get_or_set(key, build, 1, using=LOCK, beta=50, wait=5) == "first"
        assert build.calls == 0
    finally:
        let_go.set()
        thread.join()


def test_xfetch_probability_follows_the_paper() -> None:
    # P(due) = exp(-(fresh_until - now) / (delta * beta)): 10 s left, delta 5, beta 1.
    n = 20000
    hits = sum(entry.due(110.0, 5.0, 1.0, 100.0) for _ in range(n))
    assert abs(hits / n - 0.1353) < 0.02
    assert not any(entry.due(110.0, 5.0, 0.0, 100.0) for _ in range(100))
    assert not any(entry.due(None, 5.0, 1.0, 100.0) for _ in range(100))


@pytest.mark.parametrize("policy", ["build", "raise", "stale", "callable"])
def test_a_wait_past_its_bound_follows_on_timeout(policy: str, unique) -> None:
    key = unique("k")
    if policy == "stale":
        # Kept for wait seconds past its stale window: the fallback a waiter may serve.
        caching.get_or_set(key, Builder("old"), 0.05, using=LOCK, stale=0.05, wait=5,
                           on_timeout="stale", beta=0)
        time.sleep(0.2)
    let_go, thread = held_in_thread(lock_name(key))
    try:
        build = Builder("unlocked")
        call = lambda: caching.get_or_set(  # noqa: E731
            key, build, 60, using=LOCK, wait=0.1,
            on_timeout=(lambda exc: f"fallback:{type(exc).__name__}")
            if policy == "callable" else policy,
        )
        if policy == "raise":
            with pytest.raises(LockTimeout, match="on_timeout"):
                call()
        elif policy == "build":
            assert call() == "unlocked" and build.calls == 1
            assert caches["default"].get(key)[5] is None  # stored without a token
        elif policy == "stale":
            assert call() == "old" and build.calls == 0
        else:
            assert call() == "fallback:LockTimeout" and build.calls == 0
    finally:
        let_go.set()
        thread.join()


def test_stale_on_timeout_with_nothing_to_serve_raises(unique) -> None:
    key = unique("k")
    let_go, thread = held_in_thread(lock_name(key))
    try:
        with pytest.raises(LockTimeout):
            caching.get_or_set(key, Builder(), 60, using=LOCK, wait=0.05, on_timeout="stale")
    finally:
        let_go.set()
        thread.join()


def test_a_down_lock_server_builds_by_default_or_raises(unique) -> None:
    require_redis()
    key = unique("k")
    with backend_unavailable("redis"):
        build = Builder("unlocked")
        assert caching.get_or_set(key, build, 60, using="redis") == "unlocked"
        assert build.calls == 1
        with pytest.raises(BackendUnavailable):
            caching.get_or_set(unique("k2"), build, 60, using="redis", on_unavailable="raise")
        assert caching.get_or_set(unique("k3"), build, 60, using="redis",
                                  on_unavailable=lambda exc: "answer") == "answer"


def test_a_down_lock_server_serves_a_stale_value_rather_than_build(unique) -> None:
    require_redis()
    key = unique("k")
    caching.get_or_set(key, Builder("old"), 0.05, using="redis", stale=30, beta=0)
    time.sleep(0.1)
    with backend_unavailable("redis"):
        build = Builder("new")
        assert caching.get_or_set(key, build, 0.05, using="redis", stale=30) == "old"
        assert build.calls == 0


def test_bad_arguments_are_refused_before_any_server_call(unique) -> None:
    key = unique("k")
    with pytest.raises(ValueError, match="above 0"):
        caching.get_or_set(key, 1, 0, using=LOCK)
    with pytest.raises(TypeError, match="key"):
        caching.get_or_set(42, 1, 5, using=LOCK)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_timeout"):
        caching.get_or_set(key, 1, 5, using=LOCK, on_timeout="retry")
    with pytest.raises(ValueError, match="on_unavailable"):
        caching.get_or_set(key, 1, 5, using=LOCK, on_unavailable="stale")
    with pytest.raises(ValueError, match="ttl"):
        caching.get_or_set(key, 1, 5, using=LOCK, ttl=0)
    with pytest.raises(TypeError, match="beta"):
        caching.get_or_set(key, 1, 5, using=LOCK, beta="1")  # type: ignore[arg-type]
    with pytest.raises(InvalidLockAlias):
        caching.get_or_set(key, 1, 5, using="nope")
    with pytest.raises(InvalidCacheBackendError):
        caching.get_or_set(key, 1, 5, cache="nope", using=LOCK)
    assert caches["default"].get(key) is None


@pytest.mark.filterwarnings("ignore::django.core.cache.backends.base.CacheKeyWarning")
def test_keys_of_any_text_get_a_lock_name(unique) -> None:
    key = unique("k") + "\x00\n\\ü"
    assert caching.get_or_set(key, Builder(), 60, using=LOCK) == "built"


def test_a_default_that_calls_itself_on_the_same_key_is_told() -> None:
    from django_distlock.exceptions import SelfDeadlock

    def again() -> object:
        return caching.get_or_set("self", again, 60, using=LOCK)

    with pytest.raises(SelfDeadlock):
        caching.get_or_set("self", again, 60, using=LOCK)


# -- invalidation -----------------------------------------------------------------


def test_invalidate_leaves_a_fenced_tombstone_that_reads_as_a_miss(unique) -> None:
    key = unique("k")
    caching.get_or_set(key, Builder("v1"), 60, using=LOCK)
    assert caching.invalidate(key, using=LOCK) is True
    stored = caches["default"].get(key)
    assert entry.is_entry(stored) and stored[1] == entry.GONE and stored[5] is not None
    assert caching.get_or_set(key, Builder("v2"), 60, using=LOCK) == "v2"


def test_a_builder_older_than_the_invalidation_cannot_store(unique) -> None:
    key = unique("k")
    caching.get_or_set(key, Builder("v1"), 60, using=LOCK)
    earlier = caches["default"].get(key)[5]
    old = entry.pack("outdated", time.time() + 60, 0.1, LOCK, earlier)  # its grant's token
    caching.invalidate(key, using=LOCK)
    assert stores.write(caches["default"], key, None, old, 60) is False
    assert caches["default"].get(key)[1] == entry.GONE


def test_invalidate_without_the_lock_deletes(unique) -> None:
    require_redis()
    key = unique("k")
    caching.get_or_set(key, Builder("v1"), 60, using="redis")
    with backend_unavailable("redis"):
        assert caching.invalidate(key, using="redis") is False
    assert caches["default"].get(key) is None


# -- async ------------------------------------------------------------------------


def test_async_fill_awaits_an_async_builder(unique) -> None:
    key = unique("k")
    calls = []

    async def build() -> str:
        calls.append(1)
        await asyncio.sleep(0.01)
        return "async"

    async def main() -> list[object]:
        return await asyncio.gather(*(caching.aget_or_set(key, build, 60, using=LOCK)
                                      for _ in range(5)))

    assert asyncio.run(main()) == ["async"] * 5
    assert calls == [1]
    assert asyncio.run(caching.ainvalidate(key, using=LOCK)) is True


# -- the decorator ----------------------------------------------------------------


def test_cached_fills_by_template_and_invalidates(unique) -> None:
    calls = []
    prefix = unique("report")

    @caching.cached(prefix + ":{day}", timeout=60, using=LOCK)
    def report(day: int) -> int:
        calls.append(day)
        return day * 2

    assert report(3) == 6 and report(day=3) == 6 and report(4) == 8
    assert calls == [3, 4]
    assert report.key(3) == f"{prefix}:3"
    assert report.invalidate(3) is True
    assert report(3) == 6 and calls == [3, 4, 3]


def test_cached_on_an_async_function(unique) -> None:
    calls = []
    prefix = unique("front")

    @caching.cached(prefix + ":{page}", timeout=60, using=LOCK)
    async def front(page: int) -> str:
        calls.append(page)
        return f"page {page}"

    assert asyncio.run(front(1)) == "page 1" == asyncio.run(front(1))
    assert calls == [1]
    assert asyncio.run(front.ainvalidate(1)) is True


def test_cached_refuses_a_template_naming_no_argument() -> None:
    with pytest.raises(ValueError, match="does not take"):
        caching.cached("r:{nope}", timeout=5)(lambda day: day)
    with pytest.raises(ValueError, match="timeout"):
        caching.cached("r:{day}", timeout=-1)
    with pytest.raises(TypeError, match="key"):
        caching.cached(42, timeout=5)(lambda day: day)  # type: ignore[arg-type]


@override_settings(CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                       "TIMEOUT": 0}})
def test_a_cache_whose_default_timeout_stores_nothing_is_refused(unique) -> None:
    with pytest.raises(ValueError, match="TIMEOUT"):
        caching.get_or_set(unique("k"), 1, using=LOCK)


def test_the_fill_through_a_real_redis_cache_and_lock(unique) -> None:
    require_redis()
    key = unique("k")
    build = Builder("from redis")
    for _ in range(3):
        assert caching.get_or_set(key, build, 60, cache="django-redis",
                                  using="redis") == "from redis"
    assert build.calls == 1
    stored = caches["django-redis"].get(key)
    assert stored[4] == "redis" and isinstance(stored[5], int)  # the grant's alias and token


def test_hold_elsewhere_makes_a_caller_wait_then_build(unique) -> None:
    require_redis()
    key = unique("k")
    with hold_elsewhere(lock_name(key, "django-redis"), using="redis", ttl=30), \
            pytest.raises(LockTimeout):
        caching.get_or_set(key, Builder(), 60, cache="django-redis", using="redis",
                           wait=0.2, on_timeout="raise")
    assert caching.get_or_set(key, Builder("after"), 60, cache="django-redis",
                              using="redis", wait=5) == "after"
