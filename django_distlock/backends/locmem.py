"""A process-local lock backend, for tests and development (like Django's ``LocMemCache``).

Its locks exclude the threads and asyncio tasks of ONE process only: two web
workers or two task workers do not see each other's locks. Never use it in
production; ``manage.py check --deploy`` warns when an alias uses it.
Aliases with the same ``LOCATION`` share their locks.

It is also the worked example of a backend. A backend is two classes:

- an :class:`~django_distlock.backends.base.Acquisition` subclass, one per
  ``acquire()``: :meth:`attempt` (one try, no waiting: a ``Grant`` or a
  ``Miss``), :meth:`release` and :meth:`extend`; optionally :meth:`wait` (here:
  sleep until a release notifies; the default backs off with jitter) and
  ``close``, and async twins where the client has native async calls;
- a :class:`~django_distlock.backends.base.BaseLockBackend` subclass naming it
  in its ``kinds`` table, with :meth:`is_locked` and :meth:`health`, and,
  for each optional feature it sets a ``supports_*`` flag for, the hook:
  ``_held_locks`` (``supports_listing``), ``_waiters`` (``supports_waiters``),
  ``_force_release`` (``supports_force_release``).

The base class validates names and arguments, refuses (``UnsupportedOperation``)
what the flags say is missing before any I/O, and sends the signals; the handle
(``handle.py``) runs the acquire loop, timeouts, fencing, renewal and
self-deadlock detection. ``django_distlock.testing.contract`` is the test suite
every backend passes, capability by capability.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core import checks

from ..backoff import remaining
from ..exceptions import UnsupportedOperation
from ..kinds import Kind
from ..values import WaiterInfo, short_owner
from .base import (
    Acquisition,
    BaseLockBackend,
    ExcInfo,
    Freed,
    Grant,
    HeldCount,
    LockInfo,
    LockPage,
    Miss,
)

__all__ = ["LocMemBackend"]

#: Longest a waiting task sleeps without a wake-up before it looks again (a lease that
#: ended by itself wakes no one); each wait takes a random share of it, from a half up.
ASYNC_RECHECK = 1.0


@dataclass
class _Held:
    owner: str
    fencing: int
    acquired_at: datetime
    expires: float  # monotonic
    host: str
    pid: int | None
    thread: str


class _Store:
    """The locks of one ``LOCATION``: held entries, fencing counters, one condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.held: dict[str, _Held] = {}
        self.fencing: dict[str, int] = {}
        #: Per key, the acquisitions waiting now (owner token -> who and since when).
        self.waiting: dict[str, dict[str, WaiterInfo]] = {}
        #: Per key, the asyncio tasks waiting now, first come first (owner token -> its
        #: loop and the future a release sets): a release wakes one of them.
        self.wakers: dict[str, dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]]
        self.wakers = {}

    def freed(self, key: str) -> None:
        """``key`` came free: wake the waiting threads and the first waiting task (it takes
        the lock, or waits again and is woken by the next release); call with ``cond`` held.
        """
        self.cond.notify_all()
        wakers = self.wakers.get(key)
        if wakers:
            token = next(iter(wakers))
            loop, woken = wakers.pop(token)
            if not wakers:
                del self.wakers[key]
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, woken)

    def current(self, key: str) -> _Held | None:
        """The live entry of ``key`` (expired entries dropped); call with ``cond`` held."""
        entry = self.held.get(key)
        if entry is not None and entry.expires <= time.monotonic():
            del self.held[key]
            self.freed(key)
            return None
        return entry


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


def _since(info: WaiterInfo) -> datetime:
    assert info.since is not None  # locmem always knows it
    return info.since


def _forget(table: dict[str, dict[str, Any]], key: str, token: str) -> Any:
    """Take ``token`` out of ``table[key]`` (dropping an empty entry); return what it held."""
    entries = table.get(key)
    if entries is None:
        return None
    found = entries.pop(token, None)
    if not entries:
        del table[key]
    return found


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


_stores: dict[str, _Store] = {}
_stores_mutex = threading.Lock()


class LocMemAcquisition(Acquisition):
    backend: LocMemBackend

    def attempt(self) -> Grant | Miss:
        store, lock = self.backend.store, self.hold
        with store.cond:
            entry = store.current(lock.key)
            if entry is not None:
                return Miss(entry.expires - time.monotonic())
            fencing = store.fencing.get(lock.key, 0) + 1
            store.fencing[lock.key] = fencing
            now = datetime.now(UTC)
            store.held[lock.key] = _Held(
                self.token, fencing, now, time.monotonic() + lock.ttl,
                lock.host, lock.pid, lock.holder_field,
            )
        return Grant(fencing, now, now + timedelta(seconds=lock.ttl))

    _since: datetime | None = None

    def wait(self, miss: Miss) -> Grant | None:
        """Sleep until a release notifies, the holder's lease ends, or the deadline."""
        store, key, lock = self.backend.store, self.hold.key, self.hold
        if self._since is None:  # the first wait of this acquisition: its arrival
            self._since = datetime.now(UTC)
        with store.cond:
            store.waiting.setdefault(key, {})[self.token] = WaiterInfo(
                0, short_owner(self.token), self._since, lock.host, lock.pid,
                lock.holder_field, lock.kind,
            )
            try:
                if store.current(key) is not None:
                    left = remaining(self.deadline)
                    bound = miss.retry_after
                    if left is not None:
                        bound = left if bound is None else min(bound, left)
                    store.cond.wait(None if bound is None else max(bound, 0.0))
            finally:
                del store.waiting[key][self.token]
                if not store.waiting[key]:
                    del store.waiting[key]
        return None

    def release(self, exc_info: ExcInfo) -> bool:
        store = self.backend.store
        with store.cond:
            entry = store.current(self.hold.key)
            if entry is None or entry.owner != self.token:
                return False
            del store.held[self.hold.key]
            store.freed(self.hold.key)
        return True

    def extend(self, ttl: float) -> Grant | None:
        store = self.backend.store
        with store.cond:
            entry = store.current(self.hold.key)
            if entry is None or entry.owner != self.token:
                return None
            entry.expires = time.monotonic() + ttl
            expires_at = datetime.now(UTC) + timedelta(seconds=ttl)
            return Grant(entry.fencing, entry.acquired_at, expires_at)

    # -- async: the store is in memory, so on the event loop itself (no thread) ----------

    async def aattempt(self) -> Grant | Miss:
        # Never waits: the store's mutex is held only for a few dict operations. A worker
        # thread per call would cost more than the call, and its GIL hand-offs delay the loop.
        return self.attempt()

    async def async_wait(self, miss: Miss) -> Grant | None:
        """Wait until a release wakes this task (one task per release), the holder's lease
        ends, the deadline, or :data:`ASYNC_RECHECK` (a lease that ended by itself)."""
        store, key, lock = self.backend.store, self.hold.key, self.hold
        if self._since is None:
            self._since = datetime.now(UTC)
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with store.cond:
            if store.current(key) is None:
                return None
            store.waiting.setdefault(key, {})[self.token] = WaiterInfo(
                0, short_owner(self.token), self._since, lock.host, lock.pid,
                lock.holder_field, lock.kind,
            )
            store.wakers.setdefault(key, {})[self.token] = (woken.get_loop(), woken)
        bound = random.uniform(ASYNC_RECHECK / 2, ASYNC_RECHECK)
        if miss.retry_after is not None:
            bound = min(bound, max(miss.retry_after, 0.0) + 0.001)
        left = remaining(self.deadline)
        if left is not None:
            bound = min(bound, max(left, 0.0))
        leaving = True  # cancelled, unless the wait ends
        try:
            try:
                async with asyncio.timeout(bound):
                    await woken
            except TimeoutError:
                pass
            leaving = _past(self.deadline)  # the handle gives up without attempting
        finally:
            with store.cond:
                _forget(store.waiting, key, self.token)
                woken_here = _forget(store.wakers, key, self.token) is None  # by a release
                if woken_here and leaving and store.current(key) is None:
                    store.freed(key)  # a wake-up no attempt will use: the next task's
        return None

    async def arelease(self, exc_info: ExcInfo) -> bool:
        return self.release(exc_info)

    async def aextend(self, ttl: float) -> Grant | None:
        return self.extend(ttl)

    async def aclose(self) -> None:
        self.close()


class LocMemBackend(BaseLockBackend):
    """Locks in this process' memory; see the module docstring (not for production)."""

    kinds = {Kind.EXCLUSIVE: LocMemAcquisition}
    supports_fencing = True
    supports_expiry = True
    supports_leadership = True
    supports_listing = True
    supports_counting = True
    supports_force_release = True
    supports_force_release_by_owner = True
    supports_waiters = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        location = self.location or ""
        if not isinstance(location, str):
            raise UnsupportedOperation(f"DISTLOCK[{alias!r}]['LOCATION'] must be a str.")
        with _stores_mutex:
            self.store = _stores.setdefault(location, _Store())

    def is_locked(self, name: str) -> bool:
        key = self.make_key(name)
        with self.store.cond:
            return self.store.current(key) is not None

    def _held_locks(self, prefix: str, limit: int, cursor: str | None) -> LockPage:
        low = self.key_prefix + prefix
        with self.store.cond:
            # Process-local and small: sorting what is held is the whole cost.
            keys = sorted(
                k for k in list(self.store.held)
                if k.startswith(low) and k > (cursor or "") and self.store.current(k)
            )[:limit]
            now, clock = datetime.now(UTC), time.monotonic()
            infos = [
                LockInfo(
                    self.alias, self.name_of(key), short_owner(held.owner), held.fencing,
                    held.acquired_at, now + timedelta(seconds=held.expires - clock), held.host,
                    held.pid, held.thread, waiters=len(self.store.waiting.get(key, ())),
                )
                for key, held in [(key, self.store.held[key]) for key in keys]
            ]
        return LockPage(infos, keys[-1] if len(keys) == limit else None)

    def _count_held(self, prefix: str, limit: int) -> HeldCount:
        low = self.key_prefix + prefix
        with self.store.cond:
            held = list(self.store.held)
            found = sum(1 for k in held if k.startswith(low) and self.store.current(k))
        return HeldCount(min(found, limit), found <= limit)

    def _waiters(self, key: str, limit: int) -> list[WaiterInfo]:
        # In arrival order; a release wakes them all, so any one may be served next.
        with self.store.cond:
            waiting = sorted(self.store.waiting.get(key, {}).values(), key=_since)[:limit]
        return [replace(info, position=i) for i, info in enumerate(waiting, 1)]

    def _force_release(self, key: str, owner: str) -> Freed | None:
        with self.store.cond:
            entry = self.store.current(key)
            if entry is None or not short_owner(entry.owner).startswith(owner):
                return None
            del self.store.held[key]
            self.store.freed(key)
        return Freed()

    def health(self) -> float:
        return 0.0

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        if not kwargs.get("deploy"):
            return []
        return [
            checks.Warning(
                f"DISTLOCK[{self.alias!r}] uses the process-local locmem backend: its locks "
                "do not exclude other processes or machines.",
                hint="Use the database, Redis or ZooKeeper backend in production.",
                obj=self.alias,
                id="distlock.W002",
            )
        ]
