"""The audit trail's recorder: signal receivers queue lock events in memory, a thread writes them.

A receiver only appends a dict to a bounded list (no I/O, no round trip on
acquire or release); a daemon thread per process writes the list with one
``bulk_create`` every :data:`FLUSH_INTERVAL` seconds. When the database is slow
or down the list stops at :data:`CAPACITY` events and further ones are dropped
and counted (``recorder.dropped``), as are the events of a failed write.

At interpreter exit (``atexit``: a return from main, ``sys.exit``, a SIGTERM
handler that calls it as gunicorn's workers do) the writer thread writes what
is still queued, and the exit waits for it at most :data:`EXIT_TIMEOUT` seconds,
so that a database that does not answer cannot hold the exit up.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import random
import threading
import zlib
from collections.abc import Iterator
from typing import Any

from django.db import close_old_connections
from django.utils import timezone

from .. import signals
from ..models import LockEvent

#: Named for the module it was first in: logging configurations that name it keep working.
logger = logging.getLogger("django_distlock.dashboard.recorder")

CAPACITY = 10_000
FLUSH_INTERVAL = 1.0
#: Longest wait, at interpreter exit, for the events still queued to be written.
EXIT_TIMEOUT = 5.0


class Recorder:
    """The bounded queue of lock events of this process and its writer thread."""

    def __init__(self, capacity: int = CAPACITY, interval: float = FLUSH_INTERVAL) -> None:
        self.capacity = capacity
        self.interval = interval
        self.dropped = 0
        self.written = 0
        self._mutex = threading.Lock()
        self._writing = threading.Lock()  # a flush() waits for the one under way
        self._settled = threading.Condition(self._mutex)  # notified when a write ends
        self._wake = threading.Event()  # the writer thread writes now
        self._queue: list[dict[str, Any]] = []
        self._queued = 0  # events queued by this process ...
        self._done = 0  # ... and how many of them were written or dropped by a failed write
        self._pid: int | None = None  # of the process whose writer thread runs

    def add(self, row: dict[str, Any]) -> None:
        """Queue one event (the fields of a LockEvent); drop it if the queue is full."""
        with self._mutex:
            if len(self._queue) >= self.capacity:
                self.dropped += 1
                return
            self._queue.append(row)
            self._queued += 1
            if self._pid != os.getpid():  # first event, or a forked child
                self._pid = os.getpid()
                self._queue = [row]  # a child does not write its parent's events
                self._queued, self._done = 1, 0
                self._wake = threading.Event()
                threading.Thread(target=self._run, name="distlock-audit", daemon=True).start()

    def flush(self) -> int:
        """Write the queued events now; return how many were written."""
        with self._writing:
            return self._flush()

    def _flush(self) -> int:
        with self._mutex:
            rows, self._queue = self._queue, []
        if not rows:
            return 0
        try:
            LockEvent.objects.bulk_create([LockEvent(**row) for row in rows])
        except Exception:
            logger.warning("Writing %d lock events failed; dropped", len(rows), exc_info=True)
            with self._mutex:
                self.dropped += len(rows)
                self._settle(len(rows))
            return 0
        with self._mutex:
            self.written += len(rows)
            self._settle(len(rows))
        return len(rows)

    def _settle(self, count: int) -> None:
        """Count ``count`` events as done (under ``_mutex``) and tell who waits."""
        self._done += count
        self._settled.notify_all()

    def pending(self) -> int:
        """Return how many events of this process are queued or being written."""
        with self._mutex:
            return self._queued - self._done if self._pid == os.getpid() else 0

    def drain(self, timeout: float) -> bool:
        """Have the writer thread write what is queued now and wait for it at most
        ``timeout`` seconds; return whether every event queued so far was dealt with
        (written, or dropped by a failed write)."""
        with self._mutex:
            if self._pid != os.getpid():
                return True  # nothing queued in this process
            target = self._queued
            if self._done >= target:
                return True
            # The writer clears the event before it takes the queue: it takes these rows.
            self._wake.set()
            return self._settled.wait_for(lambda: self._done >= target, timeout)

    def _run(self) -> None:
        pid, wake = os.getpid(), self._wake
        while self._pid == pid:
            wake.wait(self.interval)
            wake.clear()
            try:
                self.flush()
            except Exception:  # a write's own errors are handled in _flush()
                logger.exception("The audit writer failed")
            finally:
                close_old_connections()


recorder = Recorder()


@atexit.register
def _drain_at_exit() -> None:
    """Write the events still queued when the interpreter exits, waiting at most
    :data:`EXIT_TIMEOUT` seconds (a database that does not answer cannot hold the exit)."""
    if not recorder.drain(EXIT_TIMEOUT):
        logger.warning(
            "%d lock events not written within %s s of the exit; lost",
            recorder.pending(),
            EXIT_TIMEOUT,
        )


_forcing = threading.local()


@contextlib.contextmanager
def recorded_elsewhere() -> Iterator[None]:
    """Within: force releases are not queued (the admin and the command write their own
    event, with who and why)."""
    _forcing.active = True
    try:
        yield
    finally:
        _forcing.active = False


def _sampled(kind: str, handle: Any, token: int | None) -> bool:
    """Draw for one event; an acquisition and its release or loss draw the same (a hash
    of the handle and the fencing token), so a sampled hold has both ends."""
    if handle is None or kind == LockEvent.FAILED:
        return random.random() < handle.backend.audit.sample if handle else True
    return zlib.crc32(f"{id(handle)}:{token}".encode()) / 2**32 < handle.backend.audit.sample


def _receiver(kind: str) -> Any:
    def receive(sender: Any, backend: Any, alias: str, name: str, **kwargs: Any) -> None:
        config = getattr(backend, "audit", None)
        if config is None:
            return
        handle = kwargs.get("handle")
        if kind == LockEvent.FORCE_RELEASED and getattr(_forcing, "active", False):
            return
        if config.sample < 1.0 and not _sampled(kind, handle, kwargs.get("fencing_token")):
            return
        row: dict[str, Any] = {
            "at": timezone.now(),
            "kind": kind,
            "alias": alias,
            "name": name,
            "fencing_token": kwargs.get("fencing_token"),
            "waited": kwargs.get("waited"),
        }
        if handle is not None:
            row.update(owner=handle.owner_id or "", host=handle.host, pid=handle.pid)
            row.update(thread=handle.thread, context=handle.context)
            if kind in (LockEvent.RELEASED, LockEvent.LOST):
                row["held"] = handle.held_for
        recorder.add(row)

    return receive


_RECEIVERS = {
    signals.lock_acquired: _receiver(LockEvent.ACQUIRED),
    signals.lock_not_acquired: _receiver(LockEvent.FAILED),
    signals.lock_released: _receiver(LockEvent.RELEASED),
    signals.lock_lost: _receiver(LockEvent.LOST),
    signals.lock_force_released: _receiver(LockEvent.FORCE_RELEASED),
}


def _uid(signal: Any) -> str:
    return f"django_distlock.audit.{id(signal)}"


def connect() -> None:
    """Connect the receivers (idempotent). :func:`django_distlock.handler.follow_audit`
    calls it while an alias audits, and :func:`disconnect` when none does."""
    for signal, receive in _RECEIVERS.items():
        signal.connect(receive, dispatch_uid=_uid(signal))


def disconnect() -> None:
    """Disconnect the receivers (idempotent): a lock event then calls none of them."""
    for signal in _RECEIVERS:
        signal.disconnect(dispatch_uid=_uid(signal))
