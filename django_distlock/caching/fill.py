"""The single-flight fill of one cache key, written once for sync and async callers.

The caller reads the key first and :func:`hit` answers the common case (a fresh value:
one read, no lock). Past it, :func:`fill` is a generator that yields the I/O it needs
next (take or give back the lock, read again, run the builder, write the entry, call a
policy) and receives its result, as the lock handle's core does (``steps.py``):
:func:`run` makes the calls blocking, :func:`arun` awaits their async forms.

What a caller does, by what it reads (times on the wall clock, see ``entry.py``):

- a fresh entry: returns its value; XFetch may pick this caller to rebuild early,
  which it does only if it gets the lock at once (else it returns the value);
- an entry past its freshness but within ``stale`` seconds: tries the lock without
  waiting; the one that gets it rebuilds, every other caller returns the stale value
  at once;
- nothing usable (missing, invalidated, past ``stale``): waits up to ``wait`` for the
  lock, woken by the release, re-reads, and returns what the builder stored, or
  builds itself. A builder that raised stored nothing: the next waiter builds.

The lock is the ``DISTLOCK`` alias' own (fair hand-offs, a watchdog renewing a slow
but live builder's lease); the entry is written with the grant's fencing token, so
a builder whose lease was lost cannot overwrite a later builder's value (``stores.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final

from asgiref.sync import sync_to_async
from django.core.cache.backends.base import BaseCache

from ..exceptions import BackendUnavailable, LockLost, LockTimeout
from ..handle import Lock
from ..handler import locks
from .entry import GONE, Entry, due, is_entry, pack, tombstone
from .stores import write

logger = logging.getLogger("django_distlock")

#: What ``cache.get()`` returns for a missing key (never stored).
MISSING: Final = object()

#: The ops a core yields: ``(GET,)``, ``(LOCK, handle, blocking)``, ``(BUILD,)``,
#: ``(PUT, entry, timeout)``, ``(UNLOCK, handle)``, ``(CALL, function, exc)``.
GET, LOCK, BUILD, PUT, UNLOCK, CALL = range(6)

#: ``on_timeout``/``on_unavailable``: a name or ``function(exc) -> value``.
Policy = str | Callable[[Exception], Any]


@dataclass(frozen=True, slots=True)
class Fill:
    """One call's options, checked and resolved (``caching.get_or_set``'s)."""

    cache: BaseCache
    key: str
    version: int | None
    #: Seconds an entry stays fresh; None: for ever.
    timeout: float | None
    stale: float
    beta: float
    #: The ``DISTLOCK`` alias, and the lock's name on it.
    using: str
    lock_name: str
    ttl: Any
    #: Seconds a caller with nothing to serve waits for the lock (None: for ever).
    wait: float | None
    on_timeout: Policy
    on_unavailable: Policy

    def lock(self, blocking: bool) -> Lock[Any]:
        """A handle on the key's lock (no I/O): renewed while held where leases expire.

        :param blocking: whether its acquire waits (for ``wait`` seconds).
        """
        backend = locks[self.using]
        return backend.lock(
            self.lock_name, ttl=self.ttl, timeout=self.wait, blocking=blocking,
            auto_renew=backend.supports_expiry,
        )

    def kept_for(self) -> float | None:
        """The entry's lifetime in the cache: its freshness, then ``stale`` seconds
        served while one caller rebuilds, then, with ``on_timeout="stale"``, the wait
        during which a waiter may still fall back on it."""
        if self.timeout is None:
            return None
        kept = self.timeout + self.stale
        if self.on_timeout == "stale" and self.wait is not None:
            kept += self.wait
        return kept


Core = Generator[tuple[Any, ...], Any, Any]


def hit(stored: Any, beta: float) -> Any:
    """The value to return at once for ``stored`` (the first read), or :data:`MISSING`
    when the caller has more to do (a miss, an invalidation, an expiry, an early refresh
    XFetch picked it for).

    :param stored: what ``cache.get()`` returned (:data:`MISSING` for a missing key).
    :param beta: XFetch's beta.
    :returns: the value, or :data:`MISSING`.
    """
    if stored is MISSING or not is_entry(stored):
        return stored  # missing, or stored by a plain cache.set(): a hit like any other
    value, fresh_until = stored[1], stored[2]
    if _gone(value):
        return MISSING
    if fresh_until is None:
        return value
    now = time.time()
    if now < fresh_until and not due(fresh_until, stored[3], beta, now):
        return value
    return MISSING


def fill(options: Fill, stored: Any) -> Core:
    """The fill of one key past a first read that :func:`hit` did not answer (see the
    module): yields ops, returns the value.

    :param options: the call's options.
    :param stored: the first read.
    :returns: the value (the builder's, or the cached one).
    :raises: what the builder raised; :class:`LockTimeout` or
        :class:`BackendUnavailable` where the policy says ``"raise"``.
    """
    seen: float | None = None  # the freshness end of the entry read on arrival
    old = MISSING  # its value, when it may yet be served (on_timeout="stale")
    if is_entry(stored) and not _gone(stored[1]):
        value, fresh_until = stored[1], stored[2]
        if fresh_until is not None:  # (a value fresh for ever is a hit)
            if time.time() < fresh_until + options.stale:
                # Early refresh (still fresh), or stale: rebuild only if the lock is free.
                return (yield from _refresh(options, fresh_until, value, stored[3]))
            seen, old = fresh_until, value
    return (yield from _miss(options, seen, old))


def _gone(value: Any) -> bool:
    return type(value) is str and value == GONE


def _refresh(options: Fill, seen: float | None, value: Any, delta: float) -> Core:
    """Rebuild an entry that is due (early, or stale) if the lock is free at once;
    else return its value. ``delta``: its last build's duration."""
    busy_key = (options.using, options.lock_name)
    if _busy.get(busy_key, 0.0) > time.monotonic():
        return value  # this process found it being rebuilt a moment ago: ask no more
    handle = options.lock(blocking=False)
    try:
        got = yield (LOCK, handle, False)
    except BackendUnavailable:
        return value  # a value to serve: no reason to build without the lock
    if not got:
        _note_busy(busy_key, delta)
        return value  # another caller is rebuilding it
    _busy.pop(busy_key, None)
    return (yield from _holding(options, handle, seen))


#: ``(alias, lock name) -> monotonic time``: keys this process found being rebuilt
#: (their lock busy at a try), and until when it serves their value without trying again.
_busy: dict[tuple[str, str], float] = {}
#: How many such keys a process remembers (past it, the oldest notes are dropped).
BUSY_KEYS: Final = 10_000


def _note_busy(busy_key: tuple[str, str], delta: float) -> None:
    """Serve ``busy_key``'s value without trying its lock for the last build's duration
    (at least 10 ms, at most 1 s): a caller that tries sooner finds the same builder.
    Without it, every call during a rebuild costs a lock round trip, and the callers
    served stale wait on each other's (measured: rebuild p99 3.6x a plain hit's)."""
    if len(_busy) >= BUSY_KEYS:
        now = time.monotonic()
        for stale_key in [k for k, until in _busy.items() if until <= now] or list(_busy):
            _busy.pop(stale_key, None)
    _busy[busy_key] = time.monotonic() + min(max(delta, 0.01), 1.0)


def _miss(options: Fill, seen: float | None, old: Any) -> Core:
    """Wait for the lock, then return what the builder before stored, or build."""
    handle = options.lock(blocking=True)
    try:
        got = yield (LOCK, handle, True)
    except BackendUnavailable as exc:
        return (yield from _policy(options, options.on_unavailable, exc, MISSING))
    if not got:
        timed_out = LockTimeout(
            f"Cache key {options.key!r}: its lock {options.lock_name!r} on "
            f"{options.using!r} was not had within {options.wait} s (on_timeout).",
            name=options.lock_name, alias=options.using,
        )
        return (yield from _policy(options, options.on_timeout, timed_out, old))
    return (yield from _holding(options, handle, seen))


def _holding(options: Fill, handle: Lock[Any], seen: float | None) -> Core:
    """With the lock had: read again, and return what a builder stored since the first
    read (``seen``: the freshness end read then), or build; then release."""
    try:
        stored = yield (GET,)
        if _rebuilt(stored, seen):
            return stored[1] if is_entry(stored) else stored
        return (yield from _build(options, handle))
    finally:
        yield from _unlock(handle)


def _rebuilt(stored: Any, seen: float | None) -> bool:
    """Whether ``stored``, read under the lock, is a value built since the caller's
    first read (fresher than the entry it saw, or any entry where it saw none)."""
    if stored is MISSING:
        return False
    if not is_entry(stored):
        return True
    if _gone(stored[1]):
        return False
    fresh_until = stored[2]
    return fresh_until is None or seen is None or fresh_until > seen


def _policy(options: Fill, policy: Policy, exc: Exception, old: Any) -> Core:
    if policy == "build":
        return (yield from _build(options, None))
    if policy == "stale" and old is not MISSING:
        return old
    if isinstance(policy, str):  # "raise", or "stale" with nothing to serve
        raise exc
    return (yield (CALL, policy, exc))


def _build(options: Fill, handle: Lock[Any] | None) -> Core:
    """Run the builder and store its value, fenced by ``handle``'s grant (None: built
    without the lock, stored unconditionally)."""
    started = time.monotonic()
    value = yield (BUILD,)
    delta = time.monotonic() - started
    alias = token = None
    if handle is not None:
        token = handle.fencing_token
        if token is not None:
            alias = options.using
        elif handle.lost:
            return value  # no token to fence the write with, and the lease is gone
    fresh_until = None if options.timeout is None else time.time() + options.timeout
    entry = pack(value, fresh_until, delta, alias, token)
    yield (PUT, entry, options.kept_for())
    return value


def _unlock(handle: Lock[Any]) -> Core:
    try:
        yield (UNLOCK, handle)
    except LockLost:
        # The value went to the cache fenced by the lost grant's token (or not at all).
        logger.warning("The lock of cache key %r was lost while it was rebuilt.", handle.name)
    except BackendUnavailable:
        logger.warning("Releasing the lock of cache key %r failed.", handle.name,
                       exc_info=True)


def invalidation(options: Fill) -> Core:
    """Take the key's lock (waiting for a rebuild under way), leave a tombstone fenced
    by the grant, release; without the lock (timeout, server down), delete the key."""
    handle = options.lock(blocking=True)
    try:
        got = yield (LOCK, handle, True)
    except BackendUnavailable:
        got = False
    if not got:
        yield (PUT, None, None)
        return False
    try:
        token = handle.fencing_token
        entry: Entry = tombstone(options.using if token is not None else None, token)
        yield (PUT, entry, options.kept_for())
    finally:
        yield from _unlock(handle)
    return True


# -- drivers ---------------------------------------------------------------------


def run(core: Core, options: Fill, default: Any) -> Any:
    """Drive ``core`` with blocking calls; ``default`` is the builder (or the value)."""
    cache = options.cache
    try:
        step = next(core)
        while True:
            op = step[0]
            try:
                if op == GET:
                    result = cache.get(options.key, MISSING, version=options.version)
                elif op == LOCK:
                    result = step[1].acquire(blocking=step[2])
                elif op == BUILD:
                    result = default() if callable(default) else default
                elif op == PUT:
                    result = _put(options, step[1], step[2])
                elif op == UNLOCK:
                    result = step[1].release()
                else:
                    result = step[1](step[2])
            except BaseException as exc:
                step = core.throw(exc)
            else:
                step = core.send(result)
    except StopIteration as stop:
        return stop.value


async def arun(core: Core, options: Fill, default: Any) -> Any:
    """Drive ``core`` with async calls: the lock's own, the cache's ``aget``, the
    builder awaited when it returns an awaitable, fenced writes in a thread."""
    cache = options.cache
    try:
        step = next(core)
        while True:
            op = step[0]
            try:
                if op == GET:
                    result = await cache.aget(options.key, MISSING, version=options.version)
                elif op == LOCK:
                    result = await step[1].aacquire(blocking=step[2])
                elif op == BUILD:
                    result = default() if callable(default) else default
                    if inspect.isawaitable(result):
                        result = await result
                elif op == PUT:
                    result = await sync_to_async(_put)(options, step[1], step[2])
                elif op == UNLOCK:
                    result = await asyncio.shield(step[1].arelease())
                else:
                    result = step[1](step[2])
                    if inspect.isawaitable(result):
                        result = await result
            except BaseException as exc:
                step = core.throw(exc)
            else:
                step = core.send(result)
    except StopIteration as stop:
        return stop.value


def _put(options: Fill, entry: Entry | None, timeout: float | None) -> bool:
    if entry is None:
        options.cache.delete(options.key, version=options.version)
        return True
    return write(options.cache, options.key, options.version, entry, timeout)
