"""The lock handle: what ``locks[alias].lock(name)`` builds and ``acquire()`` fills."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import holders, signals
from .context import current_context
from .exceptions import (
    BackendUnavailable,
    DistLockError,
    LockLost,
    LockNotAcquired,
    LockTimeout,
)
from .state import HandleState
from .steps import ATTEMPT, CLOSE, EXTEND, RELEASE, WAIT, Core, arun, run
from .values import (
    DEFAULT,
    Grant,
    _Default,
    join_holder,
    validate_timeout,
    validate_ttl,
)

if TYPE_CHECKING:
    from .backends.base import Acquisition, BaseLockBackend

__all__ = ["Lock"]

logger = logging.getLogger("django_distlock")

_HOST = socket.gethostname()
_NO_EXC: tuple[None, None, None] = (None, None, None)


class Lock(HandleState):
    """A handle on one named lock; one acquisition at a time.

    Ownership lives here, not in a thread-local: a handle acquired in one
    thread or task may be released from another, and two handles never see
    each other's owner token. A thread (or task) that holds a lock does not
    wait for it through another handle: that raises :class:`SelfDeadlock` at
    once, even when another thread is meant to release the first handle. The
    token (128 bits from :mod:`secrets`) is never shown; :attr:`owner_id` is a
    short non-secret id of it. What the handle holds, and how that changes,
    is :class:`~django_distlock.state.HandleState`'s (``state.py``); the calls
    to the backend are here: the acquire loop, extend and the watchdog's renew
    step each written once for sync and async (``steps.py``), the release (the
    hot path) as two thin shells over shared steps.
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
        reentrant: bool = False,
        owner_token: str | None = None,
        auto_renew: bool = False,
        max_hold: float | None = None,
        kind: str = "exclusive",
        limit: int | None = None,
    ) -> None:
        self.backend = backend
        self.name = name
        self.key = key
        self.ttl = ttl
        self.timeout = timeout
        self.blocking = blocking
        #: Whether acquiring again while held counts up instead of failing (see
        #: ``supports_reentrancy``); every acquisition needs its own release.
        self.reentrant = reentrant
        self._owner_token = owner_token
        #: Whether the watchdog renews the lease every third of ``ttl`` while held
        #: (``renewal.py``), for at most ``max_hold`` seconds from the grant.
        self.auto_renew = auto_renew
        self.max_hold = max_hold
        #: What the handle takes: ``"exclusive"`` (``lock()``), ``"read"`` or ``"write"``
        #: (``read_lock()``/``write_lock()``, where ``supports_read_write``), or one lease
        #: of a ``"semaphore"`` (``semaphore()``, where ``supports_semaphore``).
        self.kind = kind
        #: How many holders a ``"semaphore"`` handle's name admits (``semaphore()``).
        self.limit = limit
        #: Holder metadata of the current acquisition: host, pid, thread/task.
        self.host = _HOST
        self.pid: int | None = None
        self.thread = ""
        #: What the holder is doing (request path, task name; see ``context.py``), or "".
        self.context = ""
        #: The thread label and the context as backends store them (``join_holder``).
        self.holder_field = ""
        super().__init__()

    def locked(self) -> bool:
        """Return whether anyone holds this lock now (asks the backend).

        :raises BackendUnavailable: when the server fails.
        """
        return self.backend.is_locked(self.name)

    # -- acquire ---------------------------------------------------------------

    def acquire(
        self, blocking: bool | None = None, timeout: float | _Default | None = DEFAULT
    ) -> bool:
        """Acquire the lock; return True when had, False on timeout or non-blocking miss.

        :param blocking: wait for the lock (default: the handle's ``blocking``).
        :param timeout: seconds to wait; None waits forever (default: the
            handle's ``timeout``). How a backend waits (woken by the server, or
            retries with exponential backoff and jitter) is its own.
        :raises DistLockError: if this handle already holds the lock.
        :raises SelfDeadlock: if, blocking, this thread already holds the lock
            through another handle.
        :raises BackendUnavailable: when the server fails.
        """
        if run(self._acquiring(*self._begin(blocking, timeout), False)):
            return True
        self._send(signals.lock_not_acquired, waited=time.monotonic() - self._started)
        return False

    async def aacquire(
        self, blocking: bool | None = None, timeout: float | _Default | None = DEFAULT
    ) -> bool:
        """Async :meth:`acquire`: waits never block the event loop."""
        if await arun(self._acquiring(*self._begin(blocking, timeout), True)):
            return True
        self._send(signals.lock_not_acquired, waited=time.monotonic() - self._started)
        return False

    def _acquiring(self, blocking: bool, deadline: float | None, asynchronous: bool) -> Core[bool]:
        """The acquire loop (see ``steps.py``): attempt, wait, attempt again, until a
        grant whose lease is still valid, a miss when not blocking, or the deadline."""
        circuit = self.backend.circuit
        if circuit.cause is not None:  # FAIL_FAST: the server failed lately (circuit.py)
            try:
                circuit.check("acquire", self.name)
            except BackendUnavailable:
                self._busy = False
                raise
        try:
            while True:
                acquisition = self.backend.acquisition(self, self._new_token(), blocking, deadline)
                granted = False
                try:
                    sent = time.monotonic()
                    result = yield ATTEMPT, acquisition, None
                    while not isinstance(result, Grant):
                        if not blocking or _past(deadline):
                            return False
                        sent = time.monotonic()
                        grant = yield WAIT, acquisition, result
                        if grant is None:
                            if _past(deadline):
                                return False
                            sent = time.monotonic()
                            result = yield ATTEMPT, acquisition, None
                        else:
                            result = grant
                    granted = True
                finally:
                    if not granted:
                        yield CLOSE, acquisition, None
                if self._granted(acquisition, result, sent, asynchronous):
                    circuit.answered()
                    return True
                try:  # give back a grant whose lease ended before it reached us
                    yield RELEASE, acquisition, _NO_EXC
                except DistLockError:
                    logger.warning("Giving back an expired grant of %r failed", self, exc_info=True)
                if not blocking or _past(deadline):
                    return False
        except BackendUnavailable as exc:
            circuit.failed(exc)
            raise
        finally:
            self._busy = False

    def _begin(
        self, blocking: bool | None, timeout: float | _Default | None
    ) -> tuple[bool, float | None]:
        blocking = self.blocking if blocking is None else blocking
        if not isinstance(blocking, bool):
            raise TypeError("blocking must be True or False.")
        timeout = self.timeout if isinstance(timeout, _Default) else validate_timeout(timeout)
        task = holders.running_task()  # once: outside a loop, asking raises (slow)
        holder = holders.holder_of(task)
        with self._mutex:
            if self._busy or (self._token is not None and not self.reentrant):
                raise DistLockError(
                    f"{self!r} is already acquired or being acquired; a handle holds one "
                    "acquisition at a time (build another handle with .lock(), or pass "
                    "reentrant=True)."
                )
            if self._token is not None:
                self._check_process()
            else:
                if blocking and not self.reentrant and self.kind in ("exclusive", "write"):
                    holders.refuse(self, holder)
                elif blocking and self.kind == "read" and not self.backend.supports_downgrade:
                    holders.refuse(self, holder, only=("exclusive", "write"))
                self._holder = holder
            self._busy = True
        if self._token is None:
            self.pid = os.getpid()
            self.thread = holders.label_of(task)
            self.context = current_context()
            self.holder_field = join_holder(self.thread, self.context)
        self._started = time.monotonic()
        deadline = None if timeout is None or not blocking else self._started + timeout
        return blocking, deadline

    def _new_token(self) -> str:
        """The owner token of the next acquisition: the held one when acquiring again,
        the explicit owner's, or 128 new random bits."""
        return self._token or self._owner_token or secrets.token_hex(16)

    # -- release and extend ----------------------------------------------------

    def release(self) -> None:
        """Release the lock.

        :raises LockNotHeld: if this handle does not hold it.
        :raises LockLost: if it held it but the lease ended or was taken away
            before the release was sent; the handle is free afterwards either way.
        :raises BackendUnavailable: when the server fails; the release may or may
            not have reached it. The handle keeps the lock's token and
            ``release()`` may be called again (the lease is no longer renewed, and
            the thread no longer counts as its holder for ``SelfDeadlock``). A
            retry that finds the lock already free returns (and sends
            ``lock_released``): the first release went through, or the lease it
            asked to end ended by itself. See ``docs/architecture.md``.
        """
        self._release(_NO_EXC)

    def _release(self, exc_info: Any) -> None:
        # Not through steps.run(): the release is the hot path, and its shells are thin.
        acquisition, inner = self._take()
        try:
            released = acquisition.release(exc_info)
        except BaseException as exc:
            if self._after_release_error(acquisition, inner, exc):
                raise
            return
        self._released(released, inner)

    async def arelease(self) -> None:
        """Async :meth:`release`."""
        await self._arelease(_NO_EXC)

    async def _arelease(self, exc_info: Any) -> None:
        acquisition, inner = self._take()
        try:
            released = await acquisition.arelease(exc_info)
        except BaseException as exc:
            if self._after_release_error(acquisition, inner, exc):
                raise
            return
        self._released(released, inner)

    def extend(self, ttl: float | _Default = DEFAULT) -> None:
        """Make the lease end ``ttl`` seconds from now (default: the handle's ``ttl``).

        :raises LockNotHeld: if this handle does not hold the lock.
        :raises LockLost: if the lease already ended or was taken away.
        :raises BackendUnavailable: when the server fails.
        """
        run(self._extending(ttl))

    async def aextend(self, ttl: float | _Default = DEFAULT) -> None:
        """Async :meth:`extend`."""
        await arun(self._extending(ttl))

    def _extending(self, ttl: float | _Default) -> Core[None]:
        ttl = self.ttl if isinstance(ttl, _Default) else validate_ttl(ttl)
        acquisition = self._extendable()
        sent = time.monotonic()
        try:
            grant = yield EXTEND, acquisition, ttl
        except LockLost:
            self.mark_lost()
            raise
        self._extended(acquisition, grant, ttl, sent)

    # -- the watchdog's side (renewal.py) --------------------------------------

    def renew(self, acquisition: Acquisition, ttl: float) -> bool | None:
        """The watchdog's extend of ``acquisition`` (the renewal thread's).

        :param acquisition: the acquisition to renew.
        :param ttl: the new lease's length in seconds.
        :returns: True when renewed, False when the lease turned out gone (marked
            lost), None when ``acquisition`` is no longer held (released meanwhile:
            not a loss).
        :raises BackendUnavailable: what the backend's ``extend`` raises, but LockLost.
        """
        return run(self._renewing(acquisition, ttl))

    async def arenew(self, acquisition: Acquisition, ttl: float) -> bool | None:
        """Async :meth:`renew` (an event loop's renewal task); same parameters and result.

        :param acquisition: the acquisition to renew.
        :param ttl: the new lease's length in seconds.
        :returns: as :meth:`renew`.
        :raises BackendUnavailable: what the backend's ``aextend`` raises, but LockLost.
        """
        return await arun(self._renewing(acquisition, ttl))

    def _renewing(self, acquisition: Acquisition, ttl: float) -> Core[bool | None]:
        until, sent = self.valid_until, time.monotonic()
        try:
            grant = yield EXTEND, acquisition, ttl
        except LockLost:
            grant = None
        return self._renewed(acquisition, grant, ttl, sent, until)

    # -- context managers ------------------------------------------------------

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
        try:
            self._release((exc_type, exc, tb))
        except DistLockError:
            self._exit_failed(exc_type)

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
        try:
            await self._arelease((exc_type, exc, tb))
        except DistLockError:
            self._exit_failed(exc_type)

    def _exit_failed(self, exc_type: type[BaseException] | None) -> None:
        """Called inside ``except``: re-raise our error, unless the block's own matters more."""
        if exc_type is None:
            raise
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


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline
