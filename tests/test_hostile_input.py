"""Bad input and security on every lock alias of tests/settings.py (issue 22).

The shipped contract suite already refuses its BAD_NAMES before any server call and
takes its ODD_NAMES as distinct locks; this module goes further on every backend:

1. names, listing prefixes and cursors, ttl, timeout, limits and owner ids of every
   hostile kind are refused before any call that reaches the server (the contract's
   :data:`IO_ENTRY_POINTS`, counted by :func:`io_calls`);
2. every other name (``/``, ``../x``, ``{tag}``, glob and ``LIKE`` characters, 1 KB,
   1 MB, NFC and NFD forms of one text, ...) is its own lock, and what the real server
   holds afterwards (Redis keys, memcached items, ZooKeeper nodes, lock-table rows)
   stays inside the alias' key prefix, ZooKeeper root or lock table, and is gone (or
   a free row) once released;
3. a listing prefix is matched literally, and a forged cursor gives an error or a
   page of that prefix, never another's locks;
4. a guessed owner id frees, releases and extends nothing.
"""

from __future__ import annotations

import contextlib
import secrets
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.cache import caches
from django.db import connections

from django_distlock import locks
from django_distlock.backends.base import BaseLockBackend
from django_distlock.exceptions import LockNotHeld, UnsupportedOperation
from django_distlock.handle import Lock
from django_distlock.testing.contract import in_thread, io_calls

from .conftest import LIBRARY_DB, require_memcached
from .figures import record
from .test_hostile import require


def _aliases() -> list[Any]:
    """Every alias; the database ones marked for the test databases (the others run
    without, which spares each test a flush)."""
    marked = LIBRARY_DB
    return [pytest.param(alias, id=alias, marks=[marked] if config["BACKEND"].endswith(
        "DatabaseBackend") else []) for alias, config in settings.DISTLOCK.items()]


ALIASES = _aliases()

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
#: Refused wherever a name (or a listing prefix) is taken.
BAD_NAMES: list[Any] = ["", "\x00", "a\x00b", "\x01", "a\x01", "\x7f", "x\x7fy", "\ud800",
                        "a\udfffb", "\n", "\x1f", "\x9f", None, 42, 1.5, b"bytes", ["a"],
                        object()]
#: Refused as a ttl.
BAD_TTLS: list[Any] = [0, -1, -0.0, float("nan"), float("inf"), float("-inf"), 1e18, 10**30,
                       "5", None, True]
#: Refused as a timeout.
BAD_TIMEOUTS: list[Any] = [-1, -0.001, float("nan"), float("-inf"), "5", True]
#: Refused as a force_release() owner id (a listing's 8 hex digits are the only form).
BAD_OWNERS: list[Any] = ["", "abc", "ABCDEF01", "0123456g", "../../x", "0123456789", 1234,
                         b"01234567"]
#: Names taken after a tag of the test; each must be a lock of its own.
ODD = ["/", "../x", "..", "/..", "{tag}", "}{", "a{b}c", "%", "%2F", "%25", "*", "?", "[ab]",
       "\\", "'; DROP TABLE django_distlock_lock; --", " ", "ünï ✓", "\u2028", "\ufeff",
       "😀", NFC, NFD, "k" * 1024]
HUGE = 1 << 20  # a 1 MB name


def _require(alias: str) -> BaseLockBackend:
    if alias.startswith("cache-memcached"):
        require_memcached()
    elif alias == "cache-redis":
        require("redis")
    else:
        require(alias)
    return locks[alias]


def _refused(call: Callable[[], Any]) -> None:
    """``call`` raises TypeError or ValueError (or UnsupportedOperation), nothing else."""
    with pytest.raises((TypeError, ValueError, UnsupportedOperation)):
        call()


@contextlib.contextmanager
def _no_io(backend: BaseLockBackend) -> Iterator[list[str]]:
    with io_calls(backend) as calls:
        yield calls
    assert calls == [], f"refused only after {calls}"


# -- 1. refused before any server call ----------------------------------------------------


@pytest.mark.parametrize("alias", ALIASES)
def test_bad_input_is_refused_before_any_server_call(alias: str) -> None:
    backend = _require(alias)
    name = "hostile-input:" + secrets.token_hex(4)
    with _no_io(backend) as calls:
        for bad in BAD_NAMES:
            _refused(lambda bad=bad: backend.lock(bad))
            _refused(lambda bad=bad: backend.force_release(bad))
            if bad != "":  # the prefix of every name
                _refused(lambda bad=bad: backend.held_locks(prefix=bad))
            if bad not in ("", None):  # None: the first page; "": the forged cursors' test
                _refused(lambda bad=bad: backend.held_locks(cursor=bad))
            if backend.supports_read_write:
                _refused(lambda bad=bad: backend.read_lock(bad))
            if backend.supports_semaphore:
                _refused(lambda bad=bad: backend.semaphore(bad, 2))
        for bad in BAD_TTLS:
            _refused(lambda bad=bad: backend.lock(name, ttl=bad))
            _refused(lambda bad=bad: backend.lock(name).extend(bad))
        for bad in BAD_TIMEOUTS:
            _refused(lambda bad=bad: backend.lock(name, timeout=bad))
            _refused(lambda bad=bad: backend.lock(name).acquire(timeout=bad))
        if backend.supports_semaphore:
            for limit in (0, -1, 1.5, float("nan"), True, "2", 10**18):
                _refused(lambda limit=limit: backend.semaphore(name, limit))
        for limit in (0, -1, 10**9, 1.5, None, True):
            _refused(lambda limit=limit: backend.held_locks(limit=limit))
        for owner in BAD_OWNERS:
            _refused(lambda owner=owner: backend.force_release(name, owner=owner))
        # A handle never granted has nothing to give back or extend.
        for call in (lambda h: h.release(), lambda h: h.extend(), lambda h: h.extend(5)):
            with pytest.raises(LockNotHeld):
                call(backend.lock(name))
        record("bad-input", alias, refused=len(BAD_NAMES) + len(BAD_TTLS) + len(BAD_TIMEOUTS)
               + len(BAD_OWNERS), server_calls=len(calls))
    # is_locked() is itself an entry point the count watches: its refusal is checked alone.
    for bad in BAD_NAMES:
        _refused(lambda bad=bad: backend.is_locked(bad))


def test_a_huge_ttl_and_timeout_are_refused_or_waited_for() -> None:
    """Only the timeout may be huge (a wait capped per server call, tests/test_hardening.py
    for PostgreSQL); the ttl is bounded, so a lease cannot outlive the server's clock."""
    backend = locks["locmem"]
    _refused(lambda: backend.lock("huge", ttl=1e18))
    handle = backend.lock("huge", timeout=1e18)
    assert handle.acquire()
    assert in_thread(lambda: backend.lock("huge").acquire(blocking=False)) is False
    handle.release()


# -- 2. odd names: distinct locks, stored inside the alias' own space ----------------------


def _stored(alias: str, backend: Any, tag: str) -> tuple[list[str], str] | None:
    """What the server holds whose identity contains ``tag``, and the prefix all of it
    must start with; None where there is no server (process-local)."""
    config = settings.DISTLOCK[alias]
    backend_path = config["BACKEND"]
    if backend_path.endswith("LocMemBackend"):
        return None
    if backend_path.endswith("CacheBackend"):
        cache = caches[config["OPTIONS"]["CACHE"]]
        if "memcached" in alias:  # no listing: the items of the test's names that exist
            keys = {backend.driver().key(backend.make_key(name)) for name in _names(tag)}
            assert len(keys) == len(_names(tag)), "two names share an item"
            return [key for key in keys if cache._cache.get(key) is not None], \
                cache.make_key("distlock:")
        client = redis.Redis.from_url(settings.REDIS_URL)
        with contextlib.closing(client):
            found = [k.decode() for k in client.scan_iter(match=f"*{tag}*", count=1000)]
        return found, cache.make_key("distlock:")
    if backend_path.endswith("RedlockBackend"):
        found = [k.decode() for master in backend.masters
                 for k in master.sync().scan_iter(match=f"*{tag}*", count=1000)]
        return found, backend.key_prefix + "distlock{"
    if backend_path.endswith("RedisBackend"):
        client = backend.redis.sync()
        found = [k if isinstance(k, str) else k.decode()
                 for k in client.scan_iter(match=f"*{tag}*", count=1000)]
        return found, backend.key_prefix + "distlock{"
    if backend_path.endswith("ZooKeeperBackend"):
        # A lock's parent node is reaped some time after its last child: the children
        # (contenders' nodes) are what is held.
        kazoo, root = backend.client.get(), backend.settings.root
        assert not [c for c in kazoo.get_children("/") if tag in c], "a node outside the root"
        parents = [f"{root}/{child}" for child in kazoo.get_children(root) if tag in child]
        return [f"{parent}/{child}" for parent in parents
                for child in kazoo.get_children(parent)], root + "/"
    # MySQL's session mode keeps a name with its grant; every other mode, in its row.
    table = ("django_distlock_session_grant" if alias == "mysql-session"
             else "django_distlock_lock")
    with connections[backend.database].cursor() as cursor:
        cursor.execute(f"SELECT name FROM {table} WHERE name LIKE %s", [f"%{tag}%"])
        return [row[0] for row in cursor.fetchall()], backend.key_prefix


def _names(tag: str) -> list[str]:
    return [tag + odd for odd in ODD] + [tag + HUGE_TAIL]


HUGE_TAIL = "h" * HUGE


@pytest.mark.parametrize("alias", ALIASES)
def test_odd_names_are_distinct_locks_stored_inside_the_alias(alias: str) -> None:
    backend = _require(alias)
    tag = secrets.token_hex(6)
    names = _names(tag)
    handles: list[Lock] = []
    try:
        for name in names:
            handle = backend.lock(name, ttl=30)
            assert handle.acquire(blocking=False) is True, f"{name[:40]!r} was not its own lock"
            handles.append(handle)
        assert backend.is_locked(tag + NFC) and backend.is_locked(tag + NFD)
        held = _stored(alias, backend, tag)
        if held is not None:
            found, prefix = held
            outside = [key for key in found if not key.startswith(prefix)]
            record("odd-names", alias, names=len(names), stored=len(found),
                   outside_prefix=len(outside))
            assert outside == [], f"stored outside {prefix!r}: {outside}"
            assert len(found) >= len(names), (len(found), len(names))
            if "ZooKeeperBackend" in settings.DISTLOCK[alias]["BACKEND"]:  # one level down
                assert all(key.count("/") == prefix.count("/") + 1 for key in found), found
        if backend.supports_listing:
            listed = _listed(backend, tag)
            assert len(listed) == len(names)
            assert set(listed) >= {name for name in names if len(name) <= 200}
    finally:
        for handle in reversed(handles):  # transaction mode nests: innermost first
            handle.release()
    assert not backend.is_locked(tag + NFC)
    left = _stored(alias, backend, tag)
    if left is not None and not alias.endswith("-tx"):
        # Gone once released; the lock table keeps each name's row (its fencing counter),
        # free, inside the prefix.
        found, prefix = left
        if settings.DISTLOCK[alias]["BACKEND"].endswith("DatabaseBackend"):
            assert all(key.startswith(prefix) for key in found)
        else:
            assert found == [], found


def _listed(backend: BaseLockBackend, prefix: str, **page: Any) -> list[str]:
    names, cursor = [], None
    for _ in range(100):
        found = backend.held_locks(prefix=prefix, cursor=cursor, **page)
        names += [info.name for info in found.locks]
        cursor = found.next_cursor
        if cursor is None:
            return names
    raise AssertionError("the listing did not end")


# -- 3. listing prefixes and forged cursors --------------------------------------------

LITERAL = ["x%y", "xzy", "x_y", "xay", "x*y", "x?y", "x[y]", "x\\y", "x'y", "x{y}"]
FORGED = ["", "../x", "{tag}", "*", "%", "_", "9" * 60, "-1", "0", "\\", "'", "a" * 5000,
          "l:", "z:", "u:distlock{0}l:", "/", "ü"]


@pytest.mark.parametrize("alias", ALIASES)
def test_listing_prefixes_are_literal_and_cursors_cannot_escape(alias: str) -> None:
    backend = _require(alias)
    if not backend.supports_listing:  # refused as a whole (UnsupportedOperation), no I/O
        with _no_io(backend), pytest.raises(UnsupportedOperation):
            backend.held_locks(prefix="x%")
        return
    tag = secrets.token_hex(6)
    handles = [backend.lock(tag + name, ttl=30) for name in LITERAL]
    try:
        for handle in handles:
            assert handle.acquire(blocking=False)
        for name in LITERAL:
            for end in range(2, len(name) + 1):
                prefix = tag + name[:end]
                expected = {tag + other for other in LITERAL if other.startswith(name[:end])}
                assert set(_listed(backend, prefix)) == expected, prefix
                assert set(_listed(backend, prefix, limit=1)) == expected, prefix
        for forged in FORGED:
            try:
                page = backend.held_locks(prefix=tag, cursor=forged, limit=5)
            except ValueError:
                continue
            assert all(info.name.startswith(tag) for info in page.locks), (forged, page)
    finally:
        for handle in reversed(handles):
            handle.release()


# -- 4. a guessed owner id ------------------------------------------------------------------


@pytest.mark.parametrize("alias", ALIASES)
def test_a_guessed_owner_id_frees_nothing(alias: str) -> None:
    backend = _require(alias)
    name = "guessed:" + secrets.token_hex(6)
    holder = backend.lock(name, ttl=30)
    assert holder.acquire(blocking=False)
    try:
        listed = holder.owner_id
        if backend.supports_force_release_by_owner:
            for _ in range(20):
                guess = secrets.token_hex(4)
                if guess != listed:
                    assert in_thread(lambda g=guess: backend.force_release(name, owner=g)) is False
        elif backend.supports_force_release:  # the server keeps no owner: owner= is refused
            with pytest.raises(UnsupportedOperation):
                backend.force_release(name, owner=secrets.token_hex(4))
        if backend.supports_shared_owner:
            # The short id a listing shows, passed as an explicit owner: another owner.
            other = backend.lock(name, reentrant=True, owner=str(listed))
            assert in_thread(lambda: other.acquire(blocking=False)) is False
        assert backend.is_locked(name) and holder.held and not holder.lost
        if backend.supports_expiry:
            holder.extend(30)
    finally:
        holder.release()


@pytest.mark.parametrize("alias", ALIASES)
def test_a_prefix_longer_than_a_stored_head_still_lists_long_names(alias: str) -> None:
    """A name over 200 characters is stored as its first 135, a separator and its
    SHA-256: a listing prefix longer than that head still finds it (it used to find
    nothing), and whole names are still matched on the whole prefix."""
    backend = _require(alias)
    if not backend.supports_listing:
        return
    tag = secrets.token_hex(6)
    long_name, whole = tag + "q" * 300, tag + "q" * 150 + "z"
    handles = [backend.lock(name, ttl=30) for name in (long_name, whole)]
    try:
        for handle in handles:
            assert handle.acquire(blocking=False)
        shown = backend.name_of(backend.make_key(long_name))
        assert set(_listed(backend, tag + "q" * 149)) == {shown, whole}
        assert set(_listed(backend, tag + "q" * 151)) == {shown}
        # Past its head, a long name cannot be told apart: it is listed (may match).
        assert set(_listed(backend, tag + "q" * 150 + "z")) == {shown, whole}
        assert _listed(backend, tag + "r" * 200) == []
    finally:
        for handle in reversed(handles):
            handle.release()
