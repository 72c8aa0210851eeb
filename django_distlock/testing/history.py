"""Record what processes do with locks as JSON lines, then check the history.

Each worker process records its events with a :class:`HistoryRecorder` (one per
process; a forked child re-opens the file). Times are ``time.monotonic_ns()``:
on Linux ``CLOCK_MONOTONIC`` is system-wide, so the times of processes of one
machine compare (not across machines). Each event is one ``os.write`` of one
line on an ``O_APPEND`` descriptor: on a local Linux file system lines from many
processes never interleave (not on NFS). :func:`load` reads the files back and
:func:`check` verifies mutual exclusion, fencing tokens and a business invariant.

A hold counts from its grant (recorded after ``acquire()`` returned) to its
release (recorded *before* ``release()`` is sent), so a reported overlap is
one that both holders believed in. It is *valid* until the earliest of its
release, a ``lost``/``unsure`` notice, and the time its lease could have ended
(``valid_until``); holds that overlap only after one stopped being valid are
allowed (a paused holder) and reported apart, in ``overlaps_after_loss``.
The checker lives in :mod:`django_distlock.testing.checker`, re-exported here.
See docs/testing.md.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from ..handle import hold_of
from ..kinds import Kind
from .checker import (
    Event,
    HistoryError,
    HistoryReport,
    Hold,
    Overlap,
    RepeatedToken,
    Write,
    check,
    stock,
)

__all__ = [
    "Event",
    "HistoryError",
    "HistoryRecorder",
    "HistoryReport",
    "Hold",
    "Op",
    "Overlap",
    "RepeatedToken",
    "Write",
    "check",
    "load",
    "stock",
]

KINDS = tuple(kind.value for kind in Kind)
_opening = threading.Lock()


def _new_lock_in_child() -> None:
    global _opening
    _opening = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_new_lock_in_child)


class Op(NamedTuple):
    """One acquisition attempt, as :meth:`HistoryRecorder.invoke` returns it."""

    id: str
    name: str
    kind: str
    limit: int | None


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1_000_000_000)


class HistoryRecorder:
    """Append this process' lock events to the JSON-lines file ``path``.

    :param path: the history file, shared by every process of the run (created).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._pid = -1
        self._fd = -1
        self._tag = ""
        self._count: Iterator[int] = itertools.count()

    def _open(self) -> None:
        """Open (again, in a forked child) the file, with a new operation id prefix."""
        with _opening:
            if self._pid == os.getpid():  # another thread opened it
                return
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._tag, self._count = secrets.token_hex(3), itertools.count(1)
            self._pid = os.getpid()

    def close(self) -> None:
        """Close the file (the recorder re-opens it on its next event)."""
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd, self._pid = -1, -1

    def emit(self, ev: str, name: str | None, **fields: Any) -> None:
        """Write one event ``ev`` about ``name`` with its time, pid, thread and task."""
        now = time.monotonic_ns()
        if self._pid != os.getpid():
            self._open()
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop
            task = None
        event = {"t": now, "pid": self._pid, "thread": threading.get_ident(),
                 "task": id(task) if task else None, "ev": ev, "name": name, **fields}
        line = (json.dumps(event, default=str, separators=(",", ":")) + "\n").encode()
        if os.write(self._fd, line) != len(line):
            raise OSError(f"Short write of a history event to {self.path}.")

    def invoke(self, name: str, kind: str = "exclusive", limit: int | None = None) -> Op:
        """Record an acquire about to be sent; return its operation.

        :param kind: ``"exclusive"``, ``"read"``, ``"write"`` or ``"semaphore"``.
        :param limit: a semaphore's limit.
        :raises ValueError: for an unknown kind or a semaphore without a limit.
        """
        if kind not in KINDS or Kind(kind).takes_limit != (limit is not None):
            raise ValueError(f"Bad kind {kind!r} / limit {limit!r} (a semaphore needs a limit).")
        if self._pid != os.getpid():
            self._open()
        op = Op(f"{self._pid}.{self._tag}.{next(self._count)}", name, kind, limit)
        self.emit("invoke", name, op=op.id, kind=kind, limit=limit)
        return op

    def granted(self, op: Op, token: int | None = None, valid_until: float | None = None) -> None:
        """Record that ``op`` got the lock (call it right after ``acquire()`` returned).

        :param token: the grant's fencing token.
        :param valid_until: the ``time.monotonic()`` after which the lease may have
            ended on the server (``Lock`` computes it); None when it does not expire.
        """
        self.emit("granted", op.name, op=op.id, token=token, until=_ns(valid_until))

    def failed(self, op: Op, error: object = None) -> None:
        """Record that ``op`` certainly did not get the lock (a miss, a timeout)."""
        self.emit("failed", op.name, op=op.id, error=None if error is None else repr(error))

    def unknown(self, op: Op, ttl: float | None) -> None:
        """Record that whether ``op`` got the lock is unknown (the server failed).

        It counts as held from its invoke until ``ttl`` seconds after this call (not
        after the invoke: a blocking acquire may be granted long after it was sent),
        or, with ``ttl`` None (a lock that does not expire), until the end of the
        history or an :meth:`ended` of this process.
        """
        self.emit("unknown", op.name, op=op.id, ttl=_ns(ttl))

    def renewed(self, op: Op, valid_until: float) -> None:
        """Record that ``op``'s lease was extended to ``valid_until`` (``time.monotonic()``)."""
        self.emit("renewed", op.name, op=op.id, until=_ns(valid_until))

    def released(self, op: Op) -> None:
        """Record the end of ``op``'s hold: call it just *before* ``release()``."""
        self.emit("released", op.name, op=op.id)

    def lost(self, op: Op, at: float | None = None) -> None:
        """Record that ``op``'s lease became invalid at ``at`` (``time.monotonic()``, default
        now): holds of others may overlap it from then on."""
        self.emit("lost", op.name, op=op.id, at=_ns(at))

    def unsure(self, op: Op, at: float | None = None) -> None:
        """Like :meth:`lost`, for a lease that may be gone (a ZooKeeper session suspended)."""
        self.emit("unsure", op.name, op=op.id, at=_ns(at))

    def ended(self, pid: int) -> None:
        """Record that process ``pid`` was killed: its holds end now (call it in the killer)."""
        self.emit("ended", None, victim=pid)

    def write(
        self, name: str, token: int | None, accepted: bool, value: Any = None,
        began: int | None = None,
    ) -> None:
        """Record a guarded write (call it once storage answered).

        :param name: the lock name the write is guarded by.
        :param token: the fencing token it carried.
        :param accepted: whether storage accepted it.
        :param value: what it wrote (JSON), e.g. ``{"sold": 1, "left": 9}`` for :func:`stock`.
        :param began: ``time.monotonic_ns()`` before the write was sent (default: now).
        """
        self.emit("write", name, token=token, accepted=accepted, value=value, began=began)

    @contextmanager
    def hold(self, handle: Any) -> Iterator[Any]:
        """``with recorder.hold(handle):`` is ``with handle:`` with its events recorded.

        A miss or timeout records ``failed``; ``BackendUnavailable`` while acquiring
        records ``unknown`` (held until the handle's ``ttl`` from then); a lease found
        ``lost`` or ``unsure`` at the exit records that, at the time its lease could
        have ended. Every exception propagates.
        """
        op = self.invoke(handle.name, handle.kind, handle.options.limit)
        try:
            handle.__enter__()
        except BaseException as exc:
            self._not_had(op, handle, exc)
            raise
        until = self._granted(op, handle)
        try:
            yield handle
        except BaseException as exc:
            self._exit(op, handle, until)
            handle.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._exit(op, handle, until)
        handle.__exit__(None, None, None)

    @asynccontextmanager
    async def ahold(self, handle: Any) -> AsyncIterator[Any]:
        """``async with recorder.ahold(handle):``, the async :meth:`hold`."""
        op = self.invoke(handle.name, handle.kind, handle.options.limit)
        try:
            await handle.__aenter__()
        except BaseException as exc:
            self._not_had(op, handle, exc)
            raise
        until = self._granted(op, handle)
        try:
            yield handle
        except BaseException as exc:
            self._exit(op, handle, until)
            await handle.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._exit(op, handle, until)
        await handle.__aexit__(None, None, None)

    def _not_had(self, op: Op, handle: Any, exc: BaseException) -> None:
        from django_distlock.exceptions import BackendUnavailable

        if isinstance(exc, BackendUnavailable):
            self.unknown(op, handle.options.ttl if handle.backend.supports_expiry else None)
        else:
            self.failed(op, exc)

    def _granted(self, op: Op, handle: Any) -> float | None:
        until: float | None = hold_of(handle).valid_until  # the handle's conservative lease end
        self.granted(op, handle.fencing_token, until)
        return until

    def _exit(self, op: Op, handle: Any, until: float | None) -> None:
        now = time.monotonic()
        latest = hold_of(handle).valid_until
        if latest is not None and until is not None and latest > until:
            self.renewed(op, latest)
        if handle.lost or hold_of(handle).unsure:
            at = now if latest is None else min(now, latest)
            (self.lost if handle.lost else self.unsure)(op, at)
        self.released(op)


def load(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Event]:
    """Read the events of history files (a directory: its ``*.jsonl`` files), by time.

    :raises ValueError: for a line that is not a JSON event.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files = [
        f for p in map(Path, items) for f in (sorted(p.glob("*.jsonl")) if p.is_dir() else [p])
    ]
    keyed = []
    for number, path in enumerate(files):
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    event = json.loads(line)
                    keyed.append((event["t"], number, line_no, event))
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path}:{line_no}: not a history event: {line!r}") from exc
    return [event for *_, event in sorted(keyed, key=lambda k: k[:3])]
