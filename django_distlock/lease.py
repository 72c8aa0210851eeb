"""The lock handle: what ``locks[alias].lock(name)`` builds and ``acquire()`` fills."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import time
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from . import signals
from .backends.base import DEFAULT, Grant, _Default, validate_timeout, validate_ttl
from .backoff import remaining
from .exceptions import (
    BackendUnavailable,
    DistLockError,
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    LockTimeout,
)

if TYPE_CHECKING:
    from .backends.base import BaseLockBackend, Miss

logger = logging.getLogger("django_distlock")

_HOST = socket.gethostname()
_NO_EXC: tuple[None, None, None] = (None, None, None)


def holder_label() -> str:
    """Name the thread, and the asyncio task if any, that is acquiring."""
    label = threading.current_thread().name
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return f"{label}/{task.get_name()}" if task is not None else label


class Lock:
    """A handle on one named lock; one acquisition at a time.

    Ownership lives here, not in a thread-local: a handle acquired in one
    thread or task may be released from another, and two handles never see
    each other's owner token. The token (128 bits from :mod:`secrets`) is
    never shown; :attr:`owner_id` is a short non-secret id of it.
    """

    def __init__(
        self,
        backend: BaseLockBackend,
        name: str,
        key: str,
        *,
        ttl: float,
        timeout: float | None,
        blocking: bool,
    ) -> None:
        self.backend = backend
        self.name = name
        self.key = key
        self.ttl = ttl
        self.timeout = timeout
        self.blocking = blocking
        #: Holder metadata of the current acquisition: host, pid, thread/task.
        self.host = _HOST
        self.pid: int | None = None
        self.thread = ""
        #: True while ``aacquire()`` runs: its attempts run in a worker thread that
        #: serves an event loop, which a backend must not keep waiting in the server.
        self.in_event_loop = False
        #: Per-acquisition state private to the backend.
        self.backend_state: Any = None
        self._mutex = threading.Lock()
        self._token: str | None = None
        self._grant: Grant | None = None
        self._lost = False
        self._busy = False
        self._valid_until: float | None = None  # monotonic, conservative

    # -- state ----------------------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current (or last) grant, None before any."""
        return self._grant.fencing_token if self._grant else None

    @property
    def acquired_at(self) -> datetime | None:
        """Server time of the current (or last) grant."""
        return self._grant.acquired_at if self._grant else None

    @property
    def expires_at(self) -> datetime | None:
        """Server time the current lease ends; None when it does not expire."""
        return self._grant.expires_at if self._grant else None

    @property
    def held(self) -> bool:
        """Whether this handle believes it holds the lock (no I/O)."""
        return self._token is not None and not self.lost

    @property
    def lost(self) -> bool:
        """Whether the lock this handle held is known, or must be assumed, gone.

        True after the backend reported the loss, and also once the TTL has
        run out on this process' monotonic clock counted from before the
        acquire request was sent: past that point the server may have given
        the lock to someone else, so the holder must not assume it still
        has it.
        """
        if self._lost:
            return True
        until = self._valid_until
        return self._token is not None and until is not None and time.monotonic() >= until

    @property
    def owner_id(self) -> str | None:
        """A short, non-secret id of the owner token, as listings show it."""
        return short_owner(self._token) if self._token else None

    def locked(self) -> bool:
        """Return whether anyone holds this lock now (asks the backend).

        :raises BackendUnavailable: when the server fails.
        """
        return self.backend.is_locked(self.name)

    def __repr__(self) -> str:
        state = "lost" if self._lost else "held" if self._token else "free"
        return (
            f"<Lock alias={self.backend.alias!r} name={self.name!r} {state} "
            f"owner={self.owner_id} fencing_token={self.fencing_token}>"
        )

    # -- acquire ----------------------------------------------------------

    def acquire(
        self, blocking: bool | None = None, timeout: float | _Default | None = DEFAULT
    ) -> bool:
        """Acquire the lock; return True when had, False on timeout or non-blocking miss.

        :param blocking: wait for the lock (default: the handle's ``blocking``).
        :param timeout: seconds to wait; None waits forever (default: the
            handle's ``timeout``). Retries back off exponentially with full
            jitter unless the backend wakes waiters by notification.
        :raises DistLockError: if this handle already holds the lock.
        :raises BackendUnavailable: when the server fails.
        """
        token, blocking, deadline = self._begin(blocking, timeout)
        self.in_event_loop = False
        started = time.monotonic()
        try:
            result = self.backend.try_acquire(self, token, self._wait_for(blocking, deadline))
            if isinstance(result, Grant):
                return self._granted(token, result, started)
            if not blocking:
                return False
            with self.backend.waiter(self) as waiter:
                while True:
                    result = self.backend.try_acquire(self, token, self._wait_for(True, deadline))
                    if isinstance(result, Grant):
                        return self._granted(token, result, started)
                    left = remaining(deadline)
                    if left is not None and left <= 0:
                        return False
                    waiter.wait(result, left)
        finally:
            self._busy = False

    async def aacquire(
        self, blocking: bool | None = None, timeout: float | _Default | None = DEFAULT
    ) -> bool:
        """Async :meth:`acquire`: attempts run in a worker thread, waits do not block the loop."""
        token, blocking, deadline = self._begin(blocking, timeout)
        self.in_event_loop = True
        started = time.monotonic()
        attempt = sync_to_async(self.backend.try_acquire)
        try:
            result: Grant | Miss = await attempt(self, token, self._wait_for(blocking, deadline))
            if isinstance(result, Grant):
                return self._granted(token, result, started)
            if not blocking:
                return False
            with self.backend.waiter(self) as waiter:
                while True:
                    result = await attempt(self, token, self._wait_for(True, deadline))
                    if isinstance(result, Grant):
                        return self._granted(token, result, started)
                    left = remaining(deadline)
                    if left is not None and left <= 0:
                        return False
                    await waiter.async_wait(result, left)
        finally:
            self._busy = False

    def _begin(
        self, blocking: bool | None, timeout: float | _Default | None
    ) -> tuple[str, bool, float | None]:
        blocking = self.blocking if blocking is None else blocking
        if not isinstance(blocking, bool):
            raise TypeError("blocking must be True or False.")
        timeout = self.timeout if isinstance(timeout, _Default) else validate_timeout(timeout)
        with self._mutex:
            if self._token is not None or self._busy:
                raise DistLockError(
                    f"{self!r} is already acquired or being acquired; a handle holds one "
                    "acquisition at a time (build another handle with .lock())."
                )
            self._busy = True
        self.pid = os.getpid()
        self.thread = holder_label()
        deadline = None if timeout is None or not blocking else time.monotonic() + timeout
        return secrets.token_hex(16), blocking, deadline

    @staticmethod
    def _wait_for(blocking: bool, deadline: float | None) -> float | None:
        if not blocking:
            return 0.0
        left = remaining(deadline)
        return None if left is None else max(left, 0.0)

    def _granted(self, token: str, grant: Grant, started: float) -> bool:
        with self._mutex:
            self._token = token
            self._grant = grant
            self._lost = False
            self._valid_until = started + self.ttl if grant.expires_at is not None else None
        signals.lock_acquired.send(
            sender=type(self.backend),
            backend=self.backend,
            alias=self.backend.alias,
            name=self.name,
            fencing_token=grant.fencing_token,
            waited=time.monotonic() - started,
        )
        return True

    # -- release and extend -------------------------------------------------

    def release(self) -> None:
        """Release the lock.

        :raises LockNotHeld: if this handle does not hold it.
        :raises LockLost: if it held it but the lease ended or was taken away;
            the handle is free afterwards either way.
        :raises BackendUnavailable: when the server fails; the handle still
            holds the lock and ``release()`` may be called again.
        """
        self._release(_NO_EXC)

    async def arelease(self) -> None:
        """Async :meth:`release`."""
        await sync_to_async(self._release)(_NO_EXC)

    def _release(self, exc_info: tuple[Any, Any, Any]) -> None:
        with self._mutex:
            token = self._token
            if token is None:
                raise LockNotHeld(f"{self!r} is not held by this handle.")
            self._token = None
        try:
            released = self.backend.release_lock(self, token, exc_info)
        except BackendUnavailable:
            with self._mutex:
                self._token = token
            raise
        self.backend_state = None
        if not released:
            self._mark_lost()
            raise LockLost(f"{self!r} was no longer held when released: its lease ended.")
        signals.lock_released.send(
            sender=type(self.backend),
            backend=self.backend,
            alias=self.backend.alias,
            name=self.name,
            fencing_token=self.fencing_token,
        )

    def extend(self, ttl: float | _Default = DEFAULT) -> None:
        """Make the lease end ``ttl`` seconds from now (default: the handle's ``ttl``).

        :raises LockNotHeld: if this handle does not hold the lock.
        :raises LockLost: if the lease already ended or was taken away.
        :raises BackendUnavailable: when the server fails.
        """
        ttl = self.ttl if isinstance(ttl, _Default) else validate_ttl(ttl)
        token = self._token
        if token is None:
            raise LockNotHeld(f"{self!r} is not held by this handle.")
        if self._lost:
            raise LockLost(f"{self!r} was lost.")
        started = time.monotonic()
        grant = self.backend.extend_lock(self, token, ttl)
        if grant is None:
            self._mark_lost()
            raise LockLost(f"{self!r} could not be extended: its lease already ended.")
        with self._mutex:
            if self._token == token:
                self._grant = grant
                self._valid_until = started + ttl if grant.expires_at is not None else None

    async def aextend(self, ttl: float | _Default = DEFAULT) -> None:
        """Async :meth:`extend`."""
        await sync_to_async(self.extend)(ttl)

    def _mark_lost(self) -> None:
        self._lost = True
        signals.lock_lost.send(
            sender=type(self.backend),
            backend=self.backend,
            alias=self.backend.alias,
            name=self.name,
            fencing_token=self.fencing_token,
        )

    # -- context managers ---------------------------------------------------

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._not_acquired()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit((exc_type, exc, tb))

    async def __aenter__(self) -> Lock:
        if not await self.aacquire():
            raise self._not_acquired()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await sync_to_async(self._exit)((exc_type, exc, tb))

    def _exit(self, exc_info: tuple[Any, Any, Any]) -> None:
        try:
            self._release(exc_info)
        except DistLockError:
            if exc_info[0] is None:
                raise
            # The block's own exception matters more; keep it, log ours.
            logger.warning("Releasing %r after an exception failed", self, exc_info=True)

    def _not_acquired(self) -> LockNotAcquired:
        alias = self.backend.alias
        if self.blocking:
            return LockTimeout(
                f"Lock {self.name!r} on {alias!r} was not acquired within {self.timeout} s.",
                name=self.name,
                alias=alias,
            )
        return LockNotAcquired(
            f"Lock {self.name!r} on {alias!r} is held by someone else.", name=self.name, alias=alias
        )


def short_owner(token: str) -> str:
    """Return the non-secret id listings show for an owner token (32 of its 128 bits)."""
    return token[:8]


