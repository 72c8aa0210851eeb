"""The lock handle: what ``locks[alias].lock(name)`` builds and ``acquire()`` fills."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
import weakref
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import holders, signals
from .context import current_context
from .exceptions import (
    DistLockError,
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    LockTimeout,
    SelfDeadlock,
)
from .holders import current_holder, holder_label
from .renewal import Renewal, watch
from .steps import ATTEMPT, CLOSE, EXTEND, RELEASE, WAIT, Core, arun, run
from .values import (
    DEFAULT,
    Grant,
    _Default,
    join_holder,
    short_owner,
    validate_timeout,
    validate_ttl,
)

if TYPE_CHECKING:
    from .backends.base import Acquisition, BaseLockBackend

#: Old import paths: ``SelfDeadlock`` lives in ``exceptions``, the registry in ``holders``.
__all__ = ["Lock", "SelfDeadlock", "current_holder", "holder_label"]

logger = logging.getLogger("django_distlock")

_HOST = socket.gethostname()
_NO_EXC: tuple[None, None, None] = (None, None, None)


class Lock:
    """A handle on one named lock; one acquisition at a time.

    Ownership lives here, not in a thread-local: a handle acquired in one
    thread or task may be released from another, and two handles never see
    each other's owner token. A thread (or task) that holds a lock does not
    wait for it through another handle: that raises :class:`SelfDeadlock` at
    once, even when another thread is meant to release the first handle. The
    token (128 bits from :mod:`secrets`) is never shown; :attr:`owner_id` is a
    short non-secret id of it.
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
        #: The watchdog's entry while it renews this handle's lease (else None).
        self.renewal: Renewal | None = None
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
        #: Set by a backend while it cannot tell whether the lock is still held (a
        #: ZooKeeper session suspended: the connection dropped and the session may
        #: yet expire); stop writing until it turns False again, or ``lost`` True.
        self.unsure = False
        self._mutex = threading.Lock()
        self._acquisition: Acquisition | None = None
        self._token: str | None = None
        self._owner_id: str | None = None
        self._grant: Grant | None = None
        self._lost = False
        self._busy = False
        self._valid_until: float | None = None  # monotonic, conservative
        self._lost_at_release = False
        #: A release sent while the lease was valid raised (BackendUnavailable): it may
        #: have gone through. A later release that finds the lock gone is no loss.
        self._release_unsure = False
        self._started = 0.0
        self._granted_at: float | None = None  # monotonic, of the first grant
        self._depth = 0  # acquisitions held by this handle (above 1 only when reentrant)
        #: Who acquired it (``current_holder()``), and its entry among the held handles.
        self._holder: object = None
        self._held_ref: weakref.ref[Lock] | None = None

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
    def held_for(self) -> float | None:
        """Seconds since the current (or last) grant on this process' clock; None before."""
        return None if self._granted_at is None else time.monotonic() - self._granted_at

    @property
    def held(self) -> bool:
        """Whether this handle believes it holds the lock (no I/O); never in a
        process forked from the one that acquired it."""
        return self._token is not None and not self.lost and self.pid == os.getpid()

    @property
    def lost(self) -> bool:
        """Whether the lock this handle held is known, or must be assumed, gone.

        True after the backend reported the loss, and also once the TTL has
        run out on this process' monotonic clock, counted from the sending of
        the request that was granted (plus the time the server says it waited
        before granting): past that point the server may have given the lock
        to someone else, so the holder must not assume it still has it.
        """
        if self._lost:
            return True
        until = self._valid_until
        return self._token is not None and until is not None and time.monotonic() >= until

    @property
    def marked_lost(self) -> bool:
        """Whether the loss was recorded (:meth:`mark_lost`, a renewal or a release found
        the lease gone); unlike :attr:`lost`, not for a lease that only ran out locally."""
        return self._lost

    @property
    def valid_until(self) -> float | None:
        """The conservative end of the current (or last) lease on :func:`time.monotonic`'s
        clock (None: it does not expire): from the sending of the request that was
        granted, plus the server's wait before granting, plus the TTL. For backends
        (bounding a call by the lease) and the watchdog."""
        return self._valid_until

    @property
    def acquisition(self) -> Acquisition | None:
        """The backend's :class:`~django_distlock.backends.base.Acquisition` of the lock
        this handle holds (None when it holds none)."""
        return self._acquisition

    @property
    def fresh_token(self) -> bool:
        """Whether the next acquisition's owner token is new random bits: not the token of
        a lock this handle holds (acquired again), nor an explicit ``owner``'s."""
        return self._token is None and self._owner_token is None

    @property
    def owner_id(self) -> str | None:
        """A short, non-secret id of the owner token of the current (or last) grant, as
        listings show it (None before any)."""
        return self._owner_id

    def locked(self) -> bool:
        """Return whether anyone holds this lock now (asks the backend).

        :raises BackendUnavailable: when the server fails.
        """
        return self.backend.is_locked(self.name)

    def mark_lost(self) -> None:
        """Record that the lock is gone (for backends and watchdogs; any thread).

        Sends :data:`~django_distlock.signals.lock_lost` once; the ``with`` or
        decorator exit then raises :class:`~django_distlock.exceptions.LockLost`.
        Does nothing on a handle that holds nothing, and sends nothing after a
        release that was sent in time but raised (the holder had let go already).
        """
        self._lose(None, "")

    def _lose(self, acquisition: Acquisition | None, why: str) -> bool:
        """Mark the handle lost if it holds ``acquisition`` (None: whatever it holds);
        return whether it is lost. ``why``: log the loss as a renewal's."""
        with self._mutex:
            if self._token is None or (
                acquisition is not None and acquisition is not self._acquisition
            ):
                return False  # holds nothing, or released meanwhile: not a loss
            if self._lost:
                return True
            self._lost = True
            let_go = self._release_unsure
        if let_go:  # a release that raised was sent in time: not a loss
            self._forget()
            return True
        if why:
            logger.warning("Lock %r was lost: %s.", self, why)
        self._forget()  # stop renewing; a new handle may wait for the name
        self._send(signals.lock_lost)
        return True

    def _send(self, signal: Any, **extra: Any) -> None:
        signal.send(
            sender=type(self.backend),
            backend=self.backend,
            alias=self.backend.alias,
            name=self.name,
            fencing_token=self.fencing_token,
            handle=self,
            **extra,
        )

    def __repr__(self) -> str:
        state = "lost" if self._lost else "held" if self._token else "free"
        name = self.name if len(self.name) <= 100 else self.name[:100] + "…"
        return (
            f"<Lock alias={self.backend.alias!r} name={name!r} {state} "
            f"owner={self.owner_id} fencing_token={self.fencing_token}>"
        )

    # -- acquire ----------------------------------------------------------

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
                    return True
                try:  # give back a grant whose lease ended before it reached us
                    yield RELEASE, acquisition, _NO_EXC
                except DistLockError:
                    logger.warning("Giving back an expired grant of %r failed", self, exc_info=True)
                if not blocking or _past(deadline):
                    return False
        finally:
            self._busy = False

    def _begin(
        self, blocking: bool | None, timeout: float | _Default | None
    ) -> tuple[bool, float | None]:
        blocking = self.blocking if blocking is None else blocking
        if not isinstance(blocking, bool):
            raise TypeError("blocking must be True or False.")
        timeout = self.timeout if isinstance(timeout, _Default) else validate_timeout(timeout)
        holder = current_holder()
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
                self._holder = holder
            self._busy = True
        if self._token is None:
            self.pid = os.getpid()
            self.thread = holder_label()
            self.context = current_context()
            self.holder_field = join_holder(self.thread, self.context)
        self._started = time.monotonic()
        deadline = None if timeout is None or not blocking else self._started + timeout
        return blocking, deadline

    def _new_token(self) -> str:
        """The owner token of the next acquisition: the held one when acquiring again,
        the explicit owner's, or 128 new random bits."""
        return self._token or self._owner_token or secrets.token_hex(16)

    def _check_process(self) -> None:
        if self.pid != os.getpid():
            raise LockNotHeld(
                f"{self!r} was acquired by process {self.pid}; this process ({os.getpid()}) "
                "was forked from it and cannot use, release or extend that lease."
            )

    def _granted(
        self, acquisition: Acquisition, grant: Grant, sent: float, asynchronous: bool
    ) -> bool:
        """Record a grant; False if its lease already ran out on this process' clock."""
        valid_until = None
        if grant.expires_at is not None:
            valid_until = sent + grant.granted_after + self.ttl
            if time.monotonic() >= valid_until:
                return False
        with self._mutex:
            self._depth += 1
            again = self._depth > 1  # acquired again: the first acquisition object releases
            if again:
                self._grant = grant
                self._valid_until = valid_until
        if again:
            self._send(signals.lock_acquired, waited=time.monotonic() - self._started)
            return True
        with self._mutex:
            self._acquisition = acquisition
            self._token = acquisition.token
            self._owner_id = short_owner(acquisition.token)
            self._grant = grant
            self._lost = False
            self._release_unsure = False
            self._valid_until = valid_until
        if self.auto_renew:
            self.renewal = watch(self, acquisition, asynchronous)
        self._held_ref = holders.hold(self, self._holder)
        self._granted_at = time.monotonic()
        self._send(signals.lock_acquired, waited=self._granted_at - self._started)
        return True

    # -- release and extend -------------------------------------------------

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

    def _take(self) -> tuple[Acquisition, bool]:
        """Start a release: the acquisition, and whether an outer acquisition of a
        reentrant handle stays held after it."""
        with self._mutex:
            acquisition = self._acquisition
            if self._token is None or acquisition is None:
                raise LockNotHeld(f"{self!r} is not held by this handle.")
            self._check_process()
            # Seen as lost during the release: keep it, so the release raises (not after
            # a release sent in time that raised: a lease that ended since is no loss).
            self._lost_at_release = not self._release_unsure and (
                self._lost or self._expired_locally()
            )
            inner = self._depth > 1
            if inner:
                self._depth -= 1
            else:
                self._clear()
        return acquisition, inner

    def _clear(self) -> None:
        """Hold nothing (call with ``_mutex`` held)."""
        self._token = None
        self._acquisition = None
        self._depth = 0

    def _expired_locally(self) -> bool:
        return self._valid_until is not None and time.monotonic() >= self._valid_until

    def _after_release_error(
        self, acquisition: Acquisition, inner: bool, exc: BaseException
    ) -> bool:
        """After the backend's release raised ``exc``: return whether to raise it."""
        if isinstance(exc, LockLost):
            with self._mutex:
                self._clear()
            self._forget()
            if self._release_unsure and not inner:
                self._already_released()
                return False
            self._send_lost()
            return True
        with self._mutex:  # still held: the caller may release again
            if inner:
                self._depth += 1
            else:
                self._token = acquisition.token
                self._acquisition = acquisition
                self._depth = 1
                # Set with the token, so that a mark_lost() from another thread (a
                # session listener) sees both or neither.
                self._release_unsure = not self._lost_at_release
        if not inner:
            # Whether the release reached the server is unknown: the thread no longer
            # counts as the holder (refusing its next wait with SelfDeadlock for good is
            # worse than a wait that may end at its timeout), and renewing a lease its
            # holder let go of would keep it past its TTL.
            self._forget()
        return True

    def _released(self, released: bool, inner: bool) -> None:
        lost = not released or self._lost_at_release
        if inner and not lost:
            self._send(signals.lock_released)
            return
        with self._mutex:
            self._clear()
        self._forget()
        if lost and self._release_unsure and not inner:
            self._already_released()
            return
        if lost:
            self._send_lost()
            raise LockLost(f"{self!r} was no longer held when released: its lease ended.")
        self._release_unsure = False
        self._send(signals.lock_released)

    def _already_released(self) -> None:
        """A retried release found the lock gone after a release that was sent while the
        lease was valid and raised: that release went through, or the lease ended after
        the holder let go. Either way no critical section ran unprotected: no loss."""
        self._release_unsure = False
        logger.info(
            "%r was already released when release() was retried: the release that raised "
            "went through, or its lease ended after it was sent.", self,
        )
        self._send(signals.lock_released)

    def _forget(self) -> None:
        """Renew no more, and no longer count as held by the thread that acquired."""
        if self.renewal is not None:
            self.stop_renewal()
        ref, self._held_ref = self._held_ref, None
        if ref is not None:
            holders.let_go(self, ref)

    def stop_renewal(self) -> None:
        """Have the watchdog renew this handle's lease no more (idempotent)."""
        entry, self.renewal = self.renewal, None
        if entry is not None:
            entry.stop()

    def _send_lost(self) -> None:
        """Record the loss found by a release; signal it unless it was known already."""
        if self._lost:
            return
        self._lost = True
        self._send(signals.lock_lost)

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
        acquisition = self._acquisition
        if self._token is None or acquisition is None:
            raise LockNotHeld(f"{self!r} is not held by this handle.")
        self._check_process()
        if self.lost:
            self.mark_lost()
            raise LockLost(f"{self!r} was lost.")
        sent = time.monotonic()
        try:
            grant = yield EXTEND, acquisition, ttl
        except LockLost:
            self.mark_lost()
            raise
        if grant is None:
            self.mark_lost()
            raise LockLost(f"{self!r} could not be extended: its lease already ended.")
        with self._mutex:
            if self._acquisition is acquisition:
                self._grant = grant
                expires = grant.expires_at is not None
                self._valid_until = sent + grant.granted_after + ttl if expires else None

    # -- the watchdog's side (renewal.py) ---------------------------------------

    def renewal_state(self, acquisition: Acquisition) -> str:
        """Tell the watchdog whether to renew ``acquisition``.

        :param acquisition: the acquisition the watchdog renews.
        :returns: ``"held"`` (by ``acquisition``), ``"lost"``, or ``"busy"`` (a release
            is under way, or done).
        """
        with self._mutex:
            if self._lost or self.pid != os.getpid():
                return "lost"
            if self._token is not None and self._acquisition is acquisition:
                return "held"
            return "busy"

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
        until, sent = self._valid_until, time.monotonic()
        try:
            grant = yield EXTEND, acquisition, ttl
        except LockLost:
            grant = None
        if grant is None:
            return False if self._lose(acquisition, "a renewal found its lease gone") else None
        if until is not None and time.monotonic() >= until:
            # Renewed, but only after the lease had run out on this clock: the holder may
            # have seen it lost already, and lost stays lost.
            return False if self.renewal_lost(acquisition) else None
        with self._mutex:
            if self._token is None or self._acquisition is not acquisition:
                return None
            if self._lost:
                return False
            self._grant = grant
            expires = grant.expires_at is not None
            self._valid_until = sent + grant.granted_after + ttl if expires else None
        return True

    def renewal_lost(self, acquisition: Acquisition) -> bool:
        """Mark the handle lost, its lease having run out before a renewal succeeded, if
        ``acquisition`` is still its own.

        :param acquisition: the acquisition the watchdog renews.
        :returns: whether the handle is lost (False: released meanwhile, not a loss).
        """
        return self._lose(acquisition, "its lease ran out before a renewal succeeded")

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
