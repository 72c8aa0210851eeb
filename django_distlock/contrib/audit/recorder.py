"""The audit trail's recorder: signal receivers queue lock events in memory, a thread writes them.

A hold is one row, written when it ends: the acquisition's receiver only notes its
wait and start beside the handle (a weak mapping), and the release's or loss's queues
the row with both. A receiver only touches memory (no I/O, no round trip on acquire
or release); a daemon thread per process writes the list with one ``bulk_create``
every :data:`FLUSH_INTERVAL` seconds, and adds the same events to the activity
page's buckets (:mod:`.buckets`) in the same transaction. When the database is slow
or down the list stops at :data:`CAPACITY` events and further ones are dropped
and counted (``recorder.dropped``), as are the events of a failed write.

At interpreter exit (``atexit``: a return from main, ``sys.exit``, a SIGTERM
handler that calls it as gunicorn's workers do) and when a Celery pool process
shuts down (``worker_process_shutdown``: a prefork child exits without ``atexit``)
the writer thread writes what is still queued, with an ``acquired`` row for each
hold still open, and the exit waits for it at most :data:`EXIT_TIMEOUT` seconds,
so that a database that does not answer cannot hold the exit up.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import sys
import threading
import weakref
from datetime import datetime, timedelta
from typing import Any

from django.db import close_old_connections, router, transaction
from django.utils import timezone

from django_distlock import signals
from django_distlock.exceptions import LockConfigurationError
from django_distlock.handle import hold_of
from django_distlock.hold import Hold

from . import buckets
from .conf import audit_for, audited_aliases
from .models import LockEvent

logger = logging.getLogger("django_distlock.contrib.audit.recorder")

CAPACITY = 10_000
FLUSH_INTERVAL = 1.0
#: Longest wait, at interpreter exit, for the events still queued to be written.
EXIT_TIMEOUT = 5.0
#: Heads the reason of an operator's force release that found the holder gone.
NOT_FREED = "(not released: no longer held by that holder)"
#: Heads the name of a bulk release's one event; its alias is one, or ``ALL_ALIASES``.
BULK_NAME = "bulk release:"
ALL_ALIASES = "*"


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
        #: Holds of this process whose acquisition was sampled: handle -> (waited, start)
        #: of each acquisition it holds (a reentrant handle's inner ones last).
        self._open: weakref.WeakKeyDictionary[Any, list[tuple[float | None, datetime]]] = (
            weakref.WeakKeyDictionary()
        )

    def open_hold(self, handle: Any, waited: float | None) -> None:
        """Note that ``handle`` acquired after waiting ``waited`` seconds (no row yet)."""
        with self._mutex:
            self._open.setdefault(handle, []).append((waited, timezone.now()))

    def close_hold(self, handle: Any) -> tuple[float | None, datetime | None]:
        """Forget ``handle``'s latest hold; return its wait and start (None, None when
        not noted)."""
        with self._mutex:
            held = self._open.get(handle)
            if not held:
                return None, None
            found = held.pop()
            if not held:
                del self._open[handle]
            return found

    def add_open_holds(self) -> int:
        """Queue an ``acquired`` row for each hold of this process still open (at exit:
        its end will not be seen); return how many."""
        with self._mutex:
            holds = [
                (h, hold)
                for h, stack in self._open.items()
                if getattr(h, "held", False)
                for hold in stack
            ]
            self._open.clear()
        for handle, (waited, start) in holds:
            row = _row(LockEvent.ACQUIRED, handle.backend.alias, handle.name, handle)
            row.update(at=start, waited=waited, fencing_token=handle.fencing_token)
            self.add(row)
        return len(holds)

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
            database = router.db_for_write(LockEvent)
            with transaction.atomic(using=database):
                LockEvent.objects.using(database).bulk_create([LockEvent(**row) for row in rows])
                buckets.add_events(rows, using=router.db_for_write(buckets.LockActivity))
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


def write_event(**fields: Any) -> LockEvent:
    """Write one event now (an operator's action: it is not sampled nor queued), and
    count it in the activity buckets, in one transaction.

    :param fields: the LockEvent's fields.
    :returns: the row written.
    :raises DatabaseError: when the database fails (nothing is written then).
    """
    database = router.db_for_write(LockEvent)
    with transaction.atomic(using=database):
        event = LockEvent.objects.using(database).create(**fields)
        buckets.add_events([fields], using=router.db_for_write(buckets.LockActivity))
    return event


@atexit.register
def _drain_at_exit(**_: Any) -> None:
    """Write the events still queued when the interpreter (or a Celery pool process)
    exits, with the holds still open, waiting at most :data:`EXIT_TIMEOUT` seconds (a
    database that does not answer cannot hold the exit)."""
    recorder.add_open_holds()
    if not recorder.drain(EXIT_TIMEOUT):
        logger.warning(
            "%d lock events not written within %s s of the exit; lost",
            recorder.pending(),
            EXIT_TIMEOUT,
        )


def _row(kind: str, alias: str, name: str, handle: Hold | None) -> dict[str, Any]:
    """The fields of an event of ``handle``'s hold (None: none known), at now."""
    row: dict[str, Any] = {"at": timezone.now(), "kind": kind, "alias": alias, "name": name}
    if handle is not None:
        row.update(owner=handle.owner_id or "", host=handle.host, pid=handle.pid)
        row.update(thread=handle.thread, context=handle.context)
    return row


def _receiver(kind: str) -> Any:
    def receive(sender: Any, backend: Any, alias: str, name: str, **kwargs: Any) -> None:
        try:
            config = audit_for(alias)
        except LockConfigurationError:  # the audit app's check reports it (distlock.E003)
            return
        if config is None:
            return
        # Keyed by the handle's Hold, which lives as long as the acquisition does (a
        # handle dropped while it holds leaves its lock held until the lease ends).
        lock = kwargs.get("handle")
        handle = None if lock is None else hold_of(lock)
        if kind == LockEvent.FORCE_RELEASED and kwargs.get("by_operator"):
            return  # the operator signal sent after it records who and why
        ends = handle is not None and kind in (LockEvent.RELEASED, LockEvent.LOST)
        # A hold's end is sampled as its acquisition was: noted (open_hold) or not.
        if not ends and config.sample < 1.0 and random.random() >= config.sample:
            return
        if kind == LockEvent.ACQUIRED and handle is not None:
            recorder.open_hold(handle, kwargs.get("waited"))  # the row is written at its end
            return
        row = _row(kind, alias, name, handle)
        row.update(fencing_token=kwargs.get("fencing_token"), waited=kwargs.get("waited"))
        error = kwargs.get("error")
        if error is not None:  # an acquire that raised: what the server said
            row["reason"] = f"{type(error).__name__}: {error}"
        if ends and handle is not None:
            waited, start = recorder.close_hold(handle)
            if start is None and config.sample < 1.0:
                return  # its acquisition was not drawn
            held = handle.held_for
            if start is None and held is not None:  # acquired before the alias audited
                start = row["at"] - timedelta(seconds=held)
            row.update(held=held, waited=waited, acquired_at=start)
        recorder.add(row)

    return receive


def _connect_celery_shutdown() -> None:
    """Drain at a Celery pool process' shutdown too (when Celery is in use: imported)."""
    celery_signals = sys.modules.get("celery.signals")
    if celery_signals is not None:
        celery_signals.worker_process_shutdown.connect(
            _drain_at_exit, weak=False, dispatch_uid="django_distlock.contrib.audit.drain"
        )


_RECEIVERS = {
    signals.lock_acquired: _receiver(LockEvent.ACQUIRED),
    signals.lock_not_acquired: _receiver(LockEvent.FAILED),
    signals.lock_acquire_failed: _receiver(LockEvent.FAILED),
    signals.lock_released: _receiver(LockEvent.RELEASED),
    signals.lock_lost: _receiver(LockEvent.LOST),
    signals.lock_force_released: _receiver(LockEvent.FORCE_RELEASED),
}


def _uid(signal: Any) -> str:
    return f"django_distlock.contrib.audit.{id(signal)}"


def connect() -> None:
    """Connect the receivers (idempotent). :func:`follow_audit` calls it while an alias
    audits, and :func:`disconnect` when none does."""
    for signal, receive in _RECEIVERS.items():
        signal.connect(receive, dispatch_uid=_uid(signal))
    _connect_celery_shutdown()


def disconnect() -> None:
    """Disconnect the receivers (idempotent): a lock event then calls none of them."""
    for signal in _RECEIVERS:
        signal.disconnect(dispatch_uid=_uid(signal))


def follow_audit() -> bool:
    """Connect the receivers while an alias of ``DISTLOCK`` has ``AUDIT`` on, and
    disconnect them when none has: then a lock event calls no audit receiver.

    Called when the app is ready and when ``DISTLOCK`` changes. It reads the setting as
    it is: a malformed one is the system checks' to report.

    :returns: whether the receivers are connected.
    """
    audits = bool(audited_aliases())
    if audits:
        connect()
    else:
        disconnect()
    return audits


def _operator_released(
    *, alias: str, name: str, info: Any, actor: str, reason: str, freed: bool,
    held: float | None, **kwargs: Any,
) -> None:
    """Record an operator's force release of one lock, with who and why (every alias:
    an operator's action is recorded whether or not the alias audits its holds)."""
    write_event(
        at=timezone.now(),
        kind=LockEvent.FORCE_RELEASED,
        alias=alias,
        name=name,
        fencing_token=info.fencing_token,
        owner=info.owner,
        host=info.host,
        pid=info.pid,
        thread=info.thread,
        context=info.context,
        held=held,
        actor=actor,
        reason=reason if freed else f"{NOT_FREED} {reason}",
    )


def _bulk_released(
    *, selection: Any, actor: str, reason: str, freed: list[Any],
    skipped: list[tuple[Any, str]], **kwargs: Any,
) -> None:
    """Record an operator's bulk release as one event, beside single force releases
    (kept by routine purges, on the charts)."""
    touched = {info.alias for info in freed} | {info.alias for info, _ in skipped}
    lines = [
        reason,
        f"Freed {len(freed)}, skipped {len(skipped)}.",
        *(f"freed: {describe_lock(info)}" for info in freed),
        *(f"skipped: {describe_lock(info)}: {why}" for info, why in skipped),
    ]
    write_event(
        at=timezone.now(),
        kind=LockEvent.FORCE_RELEASED,
        alias=touched.pop() if len(touched) == 1 else ALL_ALIASES,
        name=f"{BULK_NAME} {selection.describe()}"[:255],
        host=selection.host[:255],
        pid=selection.pid,
        owner=selection.owner,
        actor=actor[:150],
        reason="\n".join(lines),
    )


def describe_lock(info: Any) -> str:
    """One line of a bulk release's audit: where, what and whose."""
    pid = f" pid {info.pid}" if info.pid is not None else ""
    return (
        f"{info.alias} {info.name} (owner {info.owner or '-'}, token "
        f"{info.fencing_token if info.fencing_token is not None else '-'}, "
        f"{info.host or '?'}{pid})"
    )


def connect_operator_receivers() -> None:
    """Record operators' force releases (idempotent; the app's ``ready()``)."""
    signals.lock_released_by_operator.connect(
        _operator_released, dispatch_uid="django_distlock.contrib.audit.operator"
    )
    signals.locks_bulk_released.connect(
        _bulk_released, dispatch_uid="django_distlock.contrib.audit.bulk"
    )
