"""Wake PostgreSQL waiters with LISTEN/NOTIFY instead of polling.

One listening connection per backend per process; a daemon thread reads
notifications (payload: the released key) and sets the events of the
waiters of that key. A release commits its ``pg_notify`` with the UPDATE
that frees the row, so a woken waiter's next attempt sees the row free.

Used by asyncio waiters, which must not block their thread in the server;
waiters in threads queue in the server instead (see the database backend's
migration 0002).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ._dbsql import CHANNEL
from .base import Miss, Waiter

logger = logging.getLogger("django_distlock")

#: Longest single sleep of a waiter, so that a notification lost while the
#: listener reconnects costs at most this much.
SAFETY_WAKE = 1.0


def notified_delay(miss: Miss, remaining: float | None) -> float:
    """How long a waiter that a release will wake sleeps at most: until the holder's
    lease ends, the deadline, or :data:`SAFETY_WAKE`, whichever comes first."""
    delay = SAFETY_WAKE if remaining is None else min(remaining, SAFETY_WAKE)
    if miss.retry_after is not None:
        delay = min(delay, max(miss.retry_after, 0.0) + 0.001)
    return max(delay, 0.0)


class Listener:
    """LISTENs on the backend's channel and wakes the waiters of each released key."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect  # returns (closer, psycopg.Connection) in autocommit
        self._mutex = threading.Lock()
        # Per key, this process' waiters, the next to wake first.
        self._waiters: dict[str, list[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._close: Callable[[], None] | None = None
        self._pid = os.getpid()
        self._stopped = False
        self.healthy = False

    def subscribe(self, key: str) -> threading.Event:
        """Return an event set when ``key`` is released; LISTEN is active on return."""
        self._ensure_running()
        event = threading.Event()
        with self._mutex:
            self._waiters.setdefault(key, []).append(event)
        return event

    def unsubscribe(self, key: str, event: threading.Event) -> None:
        """Forget a waiter; a wake-up it received and did not use goes to the next one."""
        with self._mutex:
            events = self._waiters.get(key, [])
            if event in events:
                events.remove(event)
            if not events:
                self._waiters.pop(key, None)
        if event.is_set():
            self._wake(key)

    def close(self) -> None:
        """Stop the thread and close the listening connection."""
        self._stopped = True
        thread = self._thread
        if thread is not None and thread.is_alive() and self._pid == os.getpid():
            thread.join(timeout=5)
        self._thread = None

    def _ensure_running(self) -> None:
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        with self._mutex:
            if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._stopped = False
            self._listen()
            self._thread = threading.Thread(
                target=self._run, name="django-distlock-listener", daemon=True
            )
            self._thread.start()

    def _listen(self) -> None:
        self._close, self._conn = self._connect()
        self._conn.execute(f"LISTEN {CHANNEL}")
        self.healthy = True

    def _run(self) -> None:
        while not self._stopped:
            try:
                for note in self._conn.notifies(timeout=0.5):
                    self._wake(note.payload)
            except Exception:
                if self._stopped:
                    break
                self.healthy = False
                logger.warning("LISTEN connection lost; reconnecting", exc_info=True)
                self._drop()
                self._reconnect()
        self._drop()

    def _reconnect(self) -> None:
        delay = 0.05
        while not self._stopped:
            try:
                self._listen()
            except Exception:
                time.sleep(delay)
                delay = min(delay * 2, SAFETY_WAKE)
                continue
            self._wake_all()  # a release may have been missed while disconnected
            return

    def _drop(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            try:
                close()
            except Exception:
                logger.debug("closing the LISTEN connection failed", exc_info=True)

    def _wake(self, key: str) -> None:
        # One waiter per process per release: it retries, and if another
        # process won, that winner's release wakes one of ours again. Waking
        # them all would only turn into failed attempts.
        with self._mutex:
            events = self._waiters.get(key)
            if not events:
                return
            event = next((e for e in events if not e.is_set()), None)
            if event is None:
                return
            events.remove(event)
            events.append(event)  # the others come first next time
        event.set()

    def _wake_all(self) -> None:
        with self._mutex:
            events = [event for events in self._waiters.values() for event in events]
        for event in events:
            event.set()


class NotificationWaiter(Waiter):
    """Sleeps until the key's release is notified, the holder's lease ends, or the deadline."""

    def __init__(self, listener: Listener, key: str) -> None:
        super().__init__()
        self.listener = listener
        self.key = key
        self.event: threading.Event | None = None

    def __enter__(self) -> NotificationWaiter:
        self.event = self.listener.subscribe(self.key)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.event is not None:
            self.listener.unsubscribe(self.key, self.event)

    def delay(self, miss: Miss, remaining: float | None) -> float:
        if not self.listener.healthy:
            return super().delay(miss, remaining)
        return notified_delay(miss, remaining)

    def wait(self, miss: Miss, remaining: float | None) -> None:
        assert self.event is not None
        self.event.wait(self.delay(miss, remaining))
        self.event.clear()

    async def async_wait(self, miss: Miss, remaining: float | None) -> None:
        assert self.event is not None
        await asyncio.to_thread(self.event.wait, self.delay(miss, remaining))
        self.event.clear()
