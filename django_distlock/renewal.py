"""The watchdog: keeps the leases of ``auto_renew`` handles alive while they are held.

A handle acquired with ``auto_renew=True`` is renewed every third of its TTL
(Redisson's rule), so two thirds of the lease are left as slack for a slow
renewal. One daemon thread per process renews the handles that ``acquire()``
filled, and one asyncio task per running event loop those that ``aacquire()``
filled (through ``aextend``, so native async clients stay native); each keeps
a heap of next-renewal times and sleeps until the earliest. Both renew one
handle at a time. The schedule holds handles weakly: a handle dropped without
a release is no longer renewed, and its lease ends at its TTL.

A renewal that finds the lease gone marks the handle lost at once; one that
fails (the server cannot be reached) is retried every ``min(1 s, ttl / 10)``
until the lease would have ended on this process' clock, then the handle is
marked lost. See ``docs/renewal.md``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING

from .values import MIN_TTL, validate_ttl

if TYPE_CHECKING:
    from .backends.acquisition import Acquisition
    from .hold import Hold

logger = logging.getLogger("django_distlock")

#: A lease is renewed this fraction of its TTL after its grant or last renewal.
RENEW_EVERY = 1 / 3
#: Longest wait between retries of a renewal that failed (a tenth of the TTL if shorter).
MAX_RETRY_DELAY = 1.0
#: Cancelled entries a schedule's heap may hold before it is rebuilt without them.
_COMPACT_AT = 64


class Renewal:
    """One registered acquisition of one handle in a schedule (weak references)."""

    __slots__ = ("_acquisition", "_handle", "active", "due", "hold_until", "schedule")

    def __init__(
        self,
        schedule: Schedule,
        handle: Hold,
        acquisition: Acquisition,
        due: float,
        hold_until: float | None,
    ) -> None:
        self.schedule = schedule
        self._handle = weakref.ref(handle)
        self._acquisition = weakref.ref(acquisition)
        #: When to renew next (monotonic).
        self.due = due
        #: No renewal takes the lease past this time (monotonic), from ``max_hold``.
        self.hold_until = hold_until
        self.active = True

    def stop(self) -> None:
        """Renew no more (any thread; idempotent)."""
        self.schedule.discard(self)

    def plan(self, now: float) -> tuple[Hold, Acquisition, float] | float | None:
        """What a due entry needs: renew ``(handle, acquisition, ttl)``, wait until a
        later time (a float), or nothing more (None)."""
        handle, acquisition = self._handle(), self._acquisition()
        if handle is None or acquisition is None:
            return None  # dropped without a release: the lease ends at its TTL
        state = handle.renewal_state(acquisition)
        if state == "lost":
            return None
        if state == "busy":  # a release is under way (if it fails, the handle stops this)
            return now + _retry_delay(handle)
        until = handle.valid_until
        if until is None:
            return None  # this grant does not expire
        if now >= until:
            handle.renewal_lost(acquisition)
            return None
        hold_until = self.hold_until
        if hold_until is not None and until >= hold_until:
            return None  # max_hold reached: the lease already ends at the cap
        due = until - (1 - RENEW_EVERY) * handle.ttl
        if due > now:
            return due  # extended meanwhile (extend(), or acquired again)
        ttl = handle.ttl
        if hold_until is not None:
            ttl = min(ttl, hold_until - now)
            if ttl < MIN_TTL:
                return None
        return handle, acquisition, ttl

    def after(self, handle: Hold, renewed: bool | None, error: Exception | None) -> float | None:
        """The next due time after a renewal attempt, or None when renewing is over."""
        now = time.monotonic()
        if error is not None:
            until = handle.valid_until
            logger.warning(
                "Renewing %r failed; retrying until its lease would end (in %.3f s)",
                handle, (until or now) - now, exc_info=error,
            )
            if until is None:
                return None
            return min(now + _retry_delay(handle), until)
        if renewed is None:  # released or acquired anew meanwhile
            return None if not self.active else now + _retry_delay(handle)
        if not renewed:
            return None
        until = handle.valid_until
        return None if until is None else until - (1 - RENEW_EVERY) * handle.ttl


def validate_max_hold(max_hold: object) -> float | None:
    """Return ``max_hold`` as float seconds or None (no cap), or raise saying why not."""
    if max_hold is None:
        return None
    try:
        return validate_ttl(max_hold)
    except (TypeError, ValueError) as exc:
        raise type(exc)(str(exc).replace("ttl must", "max_hold must", 1)) from None


def _retry_delay(handle: Hold) -> float:
    return min(MAX_RETRY_DELAY, handle.ttl / 10)


class Schedule:
    """Entries and a heap of their due times; subclasses run the renewals."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._mutex = threading.Lock()
        self._entries: set[Renewal] = set()
        self._heap: list[tuple[float, int, Renewal]] = []
        self._seq = itertools.count()
        self._cancelled = 0
        self._pid = os.getpid()

    def __len__(self) -> int:
        """How many handles are scheduled."""
        return len(self._entries)

    def scheduled(self, handle: Hold) -> bool:
        """Whether ``handle`` is scheduled for renewal here."""
        entry = handle.renewal
        return entry is not None and entry.schedule is self and entry in self._entries

    def discard(self, entry: Renewal) -> None:
        with self._mutex:
            if entry not in self._entries:
                return
            entry.active = False
            self._entries.discard(entry)
            self._cancelled += 1
            if self._cancelled > _COMPACT_AT and self._cancelled * 2 > len(self._heap):
                self._heap = [item for item in self._heap if item[2].active]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _push(self, entry: Renewal, due: float) -> bool:
        """Schedule ``entry`` at ``due`` (``_mutex`` held); return whether it is now first."""
        entry.due = due
        heapq.heappush(self._heap, (due, next(self._seq), entry))
        return self._heap[0][2] is entry

    def _next(self, now: float) -> Renewal | float | None:
        """Pop a due entry (``_mutex`` held), else the time the earliest is due (None:
        nothing scheduled)."""
        heap = self._heap
        while heap and not heap[0][2].active:
            heapq.heappop(heap)
            self._cancelled = max(self._cancelled - 1, 0)
        if not heap:
            return None
        due, _, entry = heap[0]
        if due > now:
            return due
        heapq.heappop(heap)
        return entry

    def _requeue(self, entry: Renewal, due: float | None) -> None:
        with self._mutex:
            if due is None or not entry.active:
                if entry.active:
                    entry.active = False
                    self._entries.discard(entry)
                return
            self._push(entry, due)


class ThreadSchedule(Schedule):
    """The handles ``acquire()`` filled: one daemon thread, started on first use."""

    THREAD_NAME = "django-distlock-renewal"

    def _reset(self) -> None:
        super()._reset()
        self._cond = threading.Condition(self._mutex)
        self._thread: threading.Thread | None = None

    def add(self, handle: Hold, acquisition: Acquisition, due: float,
            hold_until: float | None) -> Renewal:
        if self._pid != os.getpid():
            self._reset()  # a forked child: no thread, nothing of the parent's
        entry = Renewal(self, handle, acquisition, due, hold_until)
        with self._cond:
            self._entries.add(entry)
            if self._push(entry, due):
                self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=self.THREAD_NAME, daemon=True
                )
                self._thread.start()
        return entry

    def _run(self) -> None:
        while True:
            with self._cond:
                found = self._next(time.monotonic())
                if not isinstance(found, Renewal):
                    self._cond.wait(None if found is None else max(found - time.monotonic(), 0))
                    continue
            try:
                self._renew(found)
            except Exception:  # never let the thread die
                logger.exception("The renewal thread failed renewing a lock")
                self._requeue(found, None)

    def _renew(self, entry: Renewal) -> None:
        step = entry.plan(time.monotonic())
        if not isinstance(step, tuple):
            self._requeue(entry, step)
            return
        handle, acquisition, ttl = step
        renewed: bool | None = None
        error: Exception | None = None
        try:
            renewed = handle.renew(acquisition, ttl)
        except Exception as exc:
            error = exc
        self._requeue(entry, entry.after(handle, renewed, error))


class LoopSchedule(Schedule):
    """The handles ``aacquire()`` filled on one event loop: one task, while any is held."""

    TASK_NAME = "django-distlock-renewal"

    def _reset(self) -> None:
        super()._reset()
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None

    def add(self, handle: Hold, acquisition: Acquisition, due: float,
            hold_until: float | None) -> Renewal:
        """Schedule ``handle`` (in the loop's thread)."""
        entry = Renewal(self, handle, acquisition, due, hold_until)
        with self._mutex:
            self._entries.add(entry)
            first = self._push(entry, due)
            start = self._task is None
            if start:
                self._task = asyncio.get_running_loop().create_task(
                    self._run(), name=self.TASK_NAME
                )
        if first and not start and self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
        return entry

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                with self._mutex:
                    found = self._next(time.monotonic())
                    if found is None and not self._entries:
                        self._task = None  # a later add() starts another
                        return
                if not isinstance(found, Renewal):
                    self._wakeup = loop.create_future()
                    delay = None if found is None else max(found - time.monotonic(), 0.0)
                    await asyncio.wait([self._wakeup], timeout=delay)
                    self._wakeup = None
                    continue
                try:
                    await self._renew(found)
                except Exception:  # never let the task die
                    logger.exception("The renewal task failed renewing a lock")
                    self._requeue(found, None)
        except BaseException:  # cancelled: the loop is shutting down
            self._wakeup = None
            with self._mutex:
                self._task = None
            raise

    async def _renew(self, entry: Renewal) -> None:
        step = entry.plan(time.monotonic())
        if not isinstance(step, tuple):
            self._requeue(entry, step)
            return
        handle, acquisition, ttl = step
        renewed: bool | None = None
        error: Exception | None = None
        try:
            renewed = await handle.arenew(acquisition, ttl)
        except Exception as exc:
            error = exc
        self._requeue(entry, entry.after(handle, renewed, error))


#: The schedule of the handles filled by ``acquire()`` in this process.
THREADS = ThreadSchedule()
#: The schedule of each running event loop.
_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopSchedule] = (
    weakref.WeakKeyDictionary()
)
_loops_mutex = threading.Lock()


def loop_schedule() -> LoopSchedule:
    """The schedule of the running event loop (made on first use)."""
    loop = asyncio.get_running_loop()
    with _loops_mutex:
        schedule = _loops.get(loop)
        if schedule is None:
            schedule = _loops[loop] = LoopSchedule()
        return schedule


def watch(handle: Hold, acquisition: Acquisition, asynchronous: bool) -> Renewal | None:
    """Schedule the renewals of ``handle``'s new grant; None if its lease does not expire.

    :param asynchronous: renew in the running event loop's task (``aacquire()``),
        else in the renewal thread.
    """
    until = handle.valid_until
    if until is None:
        return None
    start = until - handle.ttl
    hold_until = None if handle.max_hold is None else start + handle.max_hold
    due = start + RENEW_EVERY * handle.ttl
    schedule = loop_schedule() if asynchronous else THREADS
    return schedule.add(handle, acquisition, due, hold_until)


def _reset_after_fork() -> None:
    """A forked child renews nothing: its copies of the parent's handles are not its own."""
    global _loops_mutex
    THREADS._reset()
    _loops_mutex = threading.Lock()
    for schedule in list(_loops.values()):
        schedule._reset()
    _loops.clear()


os.register_at_fork(after_in_child=_reset_after_fork)
