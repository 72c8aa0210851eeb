"""``django_distlock.caching`` with OS processes: a stampede of 16 on a missing key on
every lock backend, builds checked by the history checker, a builder SIGKILLed or
SIGSTOPped mid-build, the stale value served at once during a rebuild."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches

from django_distlock import caching
from django_distlock.caching import entry
from django_distlock.testing import HistoryRecorder, check, load

from .conftest import LIBRARY_DB, require_alias, require_memcached, require_pg, require_redis
from .figures import record
from .histories import FORK, done, fork_ready, run_forked

pytestmark = [pytest.mark.second_env, LIBRARY_DB]

#: One alias per lock backend and database mode.
LOCK_ALIASES = ["sqlite-lease", "pg-lease", "pg-tx", "pg-session", "mysql-lease",
                "mysql-session", "redis", "redlock", "redis-cluster", "zk",
                "cache-memcached", "cache-redis"]
STAMPEDE = 16


def _stampede_worker(cache: str, using: str | None, key: str, path: str, start: Any,
                     out: Any) -> None:
    recorder = HistoryRecorder(path)

    def build() -> str:
        op = recorder.invoke(key)
        recorder.granted(op)
        time.sleep(0.2)  # the database query the cache saves
        recorder.released(op)
        return f"built by {os.getpid()}"

    start.wait()
    if using is None:  # Django's own get_or_set: no lock at all
        value = caches[cache].get_or_set(key, build, 60)
    else:
        value = caching.get_or_set(key, build, 60, cache=cache, using=using, wait=60)
    recorder.close()
    out.put(value)
    done()


def _stampede(cache: str, using: str | None, key: str, tmp_path: Path) -> tuple[set[Any], Any]:
    path = str(tmp_path / "builds.jsonl")
    values, exitcodes = run_forked(_stampede_worker, (cache, using, key, path), STAMPEDE)
    assert exitcodes == [0] * STAMPEDE
    return set(values), check(load(path))


def test_djangos_get_or_set_builds_in_every_process(tmp_path, unique) -> None:
    """The control: without a lock the check sees many builds, overlapping."""
    require_redis()
    _, report = _stampede("django-redis", None, unique("control"), tmp_path)
    assert report.holds > 1 and report.overlaps
    record("cache-stampede", "django get_or_set", processes=STAMPEDE, builds=report.holds)


@pytest.mark.parametrize("using", LOCK_ALIASES)
def test_a_stampede_builds_once_on_every_lock_backend(using: str, tmp_path, unique) -> None:
    require_redis()
    require_alias(using)
    values, report = _stampede("django-redis", using, unique("stampede"), tmp_path)
    assert report.holds == 1, report
    assert report.ok, report
    assert len(values) == 1  # all 16 return the one value built
    record("cache-stampede", using, processes=STAMPEDE, builds=report.holds)


@pytest.mark.parametrize("cache", ["locks-memcached", "fill-pg", "fill-sqlite"])
def test_a_stampede_builds_once_on_every_cache_kind(cache: str, tmp_path, unique) -> None:
    require_redis()
    if cache == "locks-memcached":
        require_memcached()
    elif cache == "fill-pg":
        require_pg()
    values, report = _stampede(cache, "redis", unique("stampede"), tmp_path)
    assert report.holds == 1 and report.ok, report
    assert len(values) == 1


def _looping_worker(using: str, key: str, path: str, until: float, start: Any,
                    out: Any) -> None:
    recorder = HistoryRecorder(path)

    def build() -> float:
        op = recorder.invoke(key)
        recorder.granted(op)
        time.sleep(0.02)
        recorder.released(op)
        return time.time()

    start.wait()
    calls = 0
    while time.monotonic() < until:
        caching.get_or_set(key, build, 0.2, cache="django-redis", using=using, stale=0.1,
                           wait=30)
        calls += 1
    recorder.close()
    out.put(calls)
    done()


@pytest.mark.parametrize("using", ["redis", "pg-session", "zk"])
def test_expiring_hot_key_one_builder_at_a_time(using: str, tmp_path, unique) -> None:
    """6 processes read an expiring key (0.2 s fresh, 0.1 s stale, early refresh) for
    1 s: rebuilds happen, never two at once (how many: recorded, about one per expiry;
    XFetch may pick any moment, so no upper bound is a law)."""
    require_redis()
    require_alias(using)
    path = str(tmp_path / "builds.jsonl")
    until = time.monotonic() + 1.0
    calls, exitcodes = run_forked(_looping_worker,
                                  (using, unique("hot"), path, until), 6)
    assert exitcodes == [0] * 6
    report = check(load(path))
    assert report.ok, report
    assert report.holds >= 2, report
    record("cache-hot-key", using, processes=6, calls=sum(calls), builds=report.holds)


# -- a builder that dies or pauses ------------------------------------------------


def _slow_builder(using: str, cache: str, key: str, ready: Any, resume: Any, out: Any) -> None:
    def build() -> str:
        ready.set()
        resume.wait(60)  # until the test lets it finish (or kills it)
        return "paused builder's"

    out.put(caching.get_or_set(key, build, 60, cache=cache, using=using, ttl=0.5, wait=30))
    done()


def _start_builder(using: str, cache: str, key: str) -> tuple[Any, Any, Any]:
    """A process building ``key`` until ``resume`` is set: (process, resume, out)."""
    fork_ready()
    ready, resume, out = FORK.Event(), FORK.Event(), FORK.Queue()
    builder = FORK.Process(target=_slow_builder, args=(using, cache, key, ready, resume, out))
    builder.start()
    assert ready.wait(30)
    return builder, resume, out


@pytest.mark.parametrize("using", ["redis", "pg-session"])  # a lease; a session's lock
def test_a_sigkilled_builder_lets_a_waiter_build(using: str, unique) -> None:
    require_redis()
    require_alias(using)
    key = unique("killed")
    builder, _, _ = _start_builder(using, "django-redis", key)
    os.kill(builder.pid, signal.SIGKILL)
    killed = time.monotonic()
    builder.join(10)
    value = caching.get_or_set(key, lambda: "waiter's", 60, cache="django-redis", using=using,
                               wait=30, on_timeout="raise")
    assert value == "waiter's"
    record("cache-builder-killed", using, freed_s=round(time.monotonic() - killed, 2))


@pytest.mark.parametrize("cache", ["django-redis", "django-builtin", "locks-memcached",
                                   "fill-pg", "fill-sqlite"])
def test_a_paused_builder_cannot_overwrite_a_later_builders_value(cache: str, unique) -> None:
    """SIGSTOP past the lease: another process builds and stores under a later grant;
    the paused one, resumed, finishes its build and its write is dropped."""
    require_redis()
    if cache == "locks-memcached":
        require_memcached()
    elif cache == "fill-pg":
        require_pg()
    key = unique("paused")
    builder, resume, out = _start_builder("redis", cache, key)
    try:
        os.kill(builder.pid, signal.SIGSTOP)
        time.sleep(0.8)  # past its 0.5 s lease: its watchdog is stopped too
        later = caching.get_or_set(key, lambda: "later builder's", 60, cache=cache,
                                   using="redis", wait=10, on_timeout="raise")
        assert later == "later builder's"
    finally:
        os.kill(builder.pid, signal.SIGCONT)
        resume.set()
    assert out.get(timeout=30) == "paused builder's"  # it returns what it built...
    builder.join(10)
    stored = caches[cache].get(key)
    assert entry.is_entry(stored) and stored[1] == "later builder's"  # ...and stores none


def _stale_reader(key: str, start: Any, out: Any) -> None:
    start.wait()
    value = caching.get_or_set(key, lambda: "reader built", 0.2, cache="django-redis",
                               using="redis", stale=60, beta=0)
    out.put((value, time.monotonic()))
    done()


def test_during_a_rebuild_every_other_process_gets_the_stale_value_at_once(unique) -> None:
    require_redis()
    key = unique("stale")
    caching.get_or_set(key, lambda: "old", 0.2, cache="django-redis", using="redis",
                       stale=60, beta=0)
    time.sleep(0.3)
    fork_ready()
    ready, out = FORK.Event(), FORK.Queue()

    def rebuild(ready: Any, out: Any) -> None:
        def build() -> str:
            ready.set()
            time.sleep(1.0)
            return "new"

        value = caching.get_or_set(key, build, 0.2, cache="django-redis", using="redis",
                                   stale=60, beta=0)
        out.put((value, time.monotonic()))
        done()

    builder = FORK.Process(target=rebuild, args=(ready, out))
    builder.start()
    assert ready.wait(30)
    answers, exitcodes = run_forked(_stale_reader, (key,), 8)
    built, finished = out.get(timeout=30)
    builder.join(10)
    assert exitcodes == [0] * 8 and built == "new"
    assert {value for value, _ in answers} == {"old"}
    assert max(at for _, at in answers) < finished  # answered before the rebuild ended
