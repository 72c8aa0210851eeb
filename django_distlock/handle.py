"""The lock handle: what ``locks[alias].lock(name)`` builds and ``acquire()`` fills."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from . import holders
from .exceptions import (
    BackendUnavailable,
    DistLockError,
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    LockTimeout,
)
from .hold import Hold, LockBackend
from .kinds import Kind
from .steps import ATTEMPT, CLOSE, EXTEND, RELEASE, WAIT, Core, arun, run
from .values import (
    DEFAULT,
    Grant,
    Holder,
    LockOptions,
    _Default,
    validate_ttl,
)

if TYPE_CHECKING:
    from .backends.acquisition import Acquisition

#: The class of a handle's backend (``BaseLockBackend.lock()`` returns a ``Lock`` of its
#: own class, so ``lease.backend`` is typed as the backend it came from).
B = TypeVar("B", bound=LockBackend)

__all__ = ["Lock", "hold_of"]

logger = logging.getLogger("django_distlock")

_NO_EXC: tuple[None, None, None] = (None, None, None)


class Lock(Generic[B]):
    """A handle on one named lock; one acquisition at a time.

    Ownership lives here, not in a thread-local: a handle acquired in one
    thread or task may be released from another, and two handles never see
    each other's owner token. A thread (or task) that holds a lock does not
    wait for it through another handle: that raises :class:`SelfDeadlock` at
    once, even when another thread is meant to release the first handle. The
    token (128 bits from :func:`os.urandom`, the source :mod:`secrets` draws from)
    is never shown; :attr:`owner_id` is a short non-secret id of it.

    Example::

        lease = locks["default"].lock(f"stock:{sku}", ttl=30, timeout=5)
        with lease:                  # or: if lease.acquire(): ... lease.release()
            if lease.lost:           # the lease ran out: do not write
                ...
            Product.objects.filter(sku=sku).update(fenced_by=lease.fencing_token)

    What the handle holds, and how that changes, is its
    :class:`~django_distlock.hold.Hold`'s (``hold.py``), which backends and the
    watchdog use; the calls to the backend are here: the acquire loop and extend
    each written once for sync and async (``steps.py``), the release (the hot path)
    as two thin shells over shared steps.
    """

    def __init__(
        self,
        backend: B,
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
        kind: Kind | str = Kind.EXCLUSIVE,
        limit: int | None = None,
        order_class: str | None = None,
    ) -> None:
        if not isinstance(kind, Kind):  # lock() & co. pass a Kind: no enum lookup per handle
            kind = Kind(kind)
        #: The backend this handle's lock lives on (``backend.alias`` is its alias).
        #:
        #: Example: ``if lease.backend.supports_fencing: ...``
        self.backend: B = backend
        #: The lock's name, as given to ``lock()``. Example: ``"stock:42"``.
        self.name = name
        #: The backend's key for :attr:`name`: what its server stores, and what listings
        #: and the admin show as the lock's key. Example: ``"u:stock:42"`` on Redis.
        self.key = key
        #: ``"exclusive"`` (``lock()``), ``"read"`` or ``"write"`` (``read_lock()``,
        #: ``write_lock()``), or ``"semaphore"`` (``semaphore()``).
        #:
        #: Example: ``locks["redis"].read_lock("report").kind == "read"``.
        self.kind = kind
        #: The handle's own Hold, and the one it acquires through now: its own, or, for
        #: a reentrant handle whose holder held the name already, that hold (counted).
        self._own = self._hold = Hold(
            self, backend, name, key, kind=kind, limit=limit, ttl=ttl, timeout=timeout,
            blocking=blocking, reentrant=reentrant, auto_renew=auto_renew, max_hold=max_hold,
            owner_token=owner_token, order_class=order_class,
        )
        self._reentrant = reentrant
        #: A reentrant handle's acquisitions not yet released.
        self._count = 0

    # -- what the handle holds (no I/O) ----------------------------------------

    @property
    def options(self) -> LockOptions:
        """The options the handle was built with, the alias' defaults applied.

        Example: ``locks["redis"].lock("x").options.ttl`` is the alias' ``TTL``.
        """
        hold = self._own
        return LockOptions(
            ttl=hold.ttl, timeout=hold.timeout, blocking=hold.blocking,
            reentrant=hold.reentrant, auto_renew=hold.auto_renew, max_hold=hold.max_hold,
            limit=hold.limit,
        )

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current (or last) grant, None before any (or where
        the backend has none: ``supports_fencing``). It grows with every grant of the
        name: pass it with each write so that storage refuses an older holder's.

        Example: ``Order.objects.filter(pk=pk, fence__lt=lease.fencing_token).update(...)``.
        """
        return self._hold.fencing_token

    @property
    def acquired_at(self) -> datetime | None:
        """Server time of the current (or last) grant (None before any).

        Example: ``log.info("held since %s", lease.acquired_at)``.
        """
        return self._hold.acquired_at

    @property
    def expires_at(self) -> datetime | None:
        """Server time the current lease ends; None when it does not expire.

        Example: ``lease.expires_at - lease.acquired_at`` is the TTL granted.
        """
        return self._hold.expires_at

    @property
    def held(self) -> bool:
        """Whether this handle believes it holds the lock (no I/O); never in a process
        forked from the one that acquired it.

        Example: ``if lease.held: lease.release()``.
        """
        hold = self._hold
        return hold.held and (not self._reentrant or self._count > 0)

    @property
    def held_for(self) -> float | None:
        """Seconds since the current (or last) grant on this process' clock; None before.

        Example: ``if lease.held_for > 20: lease.extend()``.
        """
        return self._hold.held_for

    @property
    def lost(self) -> bool:
        """Whether the lock this handle held is known, or must be assumed, gone.

        True after the backend reported the loss, and also once the TTL has
        run out on this process' monotonic clock, counted from the sending of
        the request that was granted (plus the time the server says it waited
        before granting): past that point the server may have given the lock
        to someone else, so the holder must not assume it still has it.

        Example: ``if lease.lost: raise RuntimeError("stop: the lock is gone")``.
        """
        return self._hold.lost

    @property
    def owner_id(self) -> str | None:
        """A short, non-secret id of the owner token of the current (or last) grant, as
        listings show it (None before any).

        Example: find this handle in ``locks["default"].held_locks()`` by ``info.owner``.
        """
        return self._hold.owner_id

    @property
    def holder(self) -> Holder:
        """Who acquired the lock through this handle: host, pid, thread (and task), and
        what it was doing (``context``), as listings show it.

        Example: ``lease.holder.pid == os.getpid()`` after ``acquire()``.
        """
        hold = self._hold
        return Holder(host=hold.host, pid=hold.pid, thread=hold.thread, context=hold.context)

    def __repr__(self) -> str:
        return repr(self._hold)

    def locked(self) -> bool:
        """Return whether anyone holds this lock now (asks the backend).

        Example: ``if not lease.locked(): schedule_rebuild()``.

        :raises BackendUnavailable: when the server fails.
        """
        return self.backend.is_locked(self.name)

    # -- acquire ---------------------------------------------------------------

    def acquire(
        self, blocking: bool | None = None, timeout: float | _Default | None = DEFAULT
    ) -> bool:
        """Acquire the lock; return True when had, False on timeout or non-blocking miss.

        A reentrant handle (``reentrant=True``) whose thread or task holds the name
        already, through it or another reentrant handle, counts one more acquisition
        at once, with no server call; each needs its release.

        :param blocking: wait for the lock (default: the handle's ``blocking``).
        :param timeout: seconds to wait; None waits forever (default: the
            handle's ``timeout``). How a backend waits (woken by the server, or
            retries with exponential backoff and jitter) is its own.
        :raises DistLockError: if this handle already holds the lock (and is not
            reentrant, or is acquired from another thread or task).
        :raises SelfDeadlock: if, blocking, this thread already holds the lock
            through another handle (not a reentrant one).
        :raises BackendUnavailable: when the server fails.

        Example::

            if lease.acquire(timeout=2):
                try: ...
                finally: lease.release()
        """
        if self._reentrant:
            if self._reenter():
                return True
            if self._acquire(*self._hold.begin(blocking, timeout)):
                self._count = 1
                return True
        elif self._acquire(*self._hold.begin(blocking, timeout)):
            return True
        self._hold.not_acquired()
        return False

    def _acquire(self, blocking: bool, deadline: float | None) -> bool:
        """The sync acquire's first attempt, made here: a free lock is granted with no
        generator around the call (the hot path); anything else (a miss, an error, a
        grant whose lease ran out on the way, an open circuit) goes on in the loop of
        :meth:`_acquiring`, which takes that first attempt's outcome as its own."""
        hold = self._hold
        backend = self.backend
        if backend.circuit.cause is not None:
            return run(self._acquiring(blocking, deadline, False))
        try:
            acquisition = backend.acquisition(hold, hold.new_token(), blocking, deadline)
        except BaseException:  # the loop builds it again, and handles what it raises
            return run(self._acquiring(blocking, deadline, False))
        sent = time.monotonic()
        try:
            result = acquisition.attempt()
        except BaseException as exc:
            return run(self._acquiring(blocking, deadline, False, (acquisition, exc, sent)))
        if isinstance(result, Grant):
            try:
                granted = hold.granted(acquisition, result, sent, False)
            except BaseException:
                hold.busy = False
                raise
            if granted:
                hold.busy = False
                if backend.circuit.cause is not None:  # opened meanwhile: an answer closes it
                    backend.circuit.answered()
                return True
        return run(self._acquiring(blocking, deadline, False, (acquisition, result, sent)))

    async def aacquire(
        self, blocking: bool | None = None, timeout: float | _Default | None = DEFAULT
    ) -> bool:
        """Async :meth:`acquire`: waits never block the event loop.

        Example: ``if await lease.aacquire(timeout=2): ...``.
        """
        if self._reentrant:
            if self._reenter():
                return True
            if await arun(self._acquiring(*self._hold.begin(blocking, timeout), True)):
                self._count = 1
                return True
        elif await arun(self._acquiring(*self._hold.begin(blocking, timeout), True)):
            return True
        self._hold.not_acquired()
        return False

    def _reenter(self) -> bool:
        """A reentrant handle: count one more acquisition of a hold that this thread or
        task holds through a reentrant handle of the name (this one or another), with
        no server call; False when there is none.

        :raises LockLost: when the hold this handle still counts acquisitions on ended
            (lost, or its lease ran out): each of them raises LockLost at its release,
            after which the handle acquires anew.
        """
        if self._count:
            if self._hold.reenter(self):
                self._count += 1
                return True
            raise LockLost(f"{self!r} was lost; release() it before acquiring again.")
        found = holders.reentry(self._own, holders.current_holder())
        if found is None or not found.reenter(self):
            return False
        self._hold, self._count = found, 1
        return True

    def _uncount(self) -> None:
        """A reentrant handle's release: one acquisition fewer (back to its own hold
        after the last)."""
        if not self._count:
            raise LockNotHeld(f"{self!r} is not held by this handle.")
        self._count -= 1
        if not self._count:
            self._hold = self._own

    def _acquiring(
        self, blocking: bool, deadline: float | None, asynchronous: bool,
        first: tuple[Acquisition, Any, float] | None = None,
    ) -> Core[bool]:
        """The acquire loop (see ``steps.py``): attempt, wait, attempt again, until a
        grant whose lease is still valid, a miss when not blocking, or the deadline.

        ``first``: the first attempt, made already (:meth:`_acquire`): its acquisition,
        its result or the exception it raised, and when it was sent."""
        hold = self._hold
        circuit = self.backend.circuit
        if first is None and circuit.cause is not None:  # FAIL_FAST: failed lately (circuit.py)
            try:
                circuit.check("acquire", self.name)
            except BackendUnavailable as exc:
                hold.busy = False
                hold.acquire_failed(exc)
                raise
        try:
            while True:
                granted = False
                if first is None:
                    acquisition = self.backend.acquisition(
                        hold, hold.new_token(), blocking, deadline)
                else:
                    acquisition, result, sent = first
                try:
                    if first is None:
                        sent = time.monotonic()
                        result = yield ATTEMPT, acquisition, None
                    else:
                        first = None
                        if isinstance(result, BaseException):
                            raise result
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
                if hold.granted(acquisition, result, sent, asynchronous):
                    if circuit.cause is not None:  # it was open: close it (no call if not)
                        circuit.answered()
                    return True
                try:  # give back a grant whose lease ended before it reached us
                    yield RELEASE, acquisition, _NO_EXC
                except DistLockError:
                    logger.warning("Giving back an expired grant of %r failed", self, exc_info=True)
                if not blocking or _past(deadline):
                    return False
        except DistLockError as exc:  # the server failed, or refused the wait or call
            if isinstance(exc, BackendUnavailable):
                circuit.failed(exc)
            hold.busy = False
            hold.acquire_failed(exc)
            raise
        finally:
            hold.busy = False

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

        Example: ``lease.release()`` (a ``with`` block calls it at its end).
        """
        self._release(_NO_EXC)

    def _release(self, exc_info: Any) -> None:
        # Not through steps.run(): the release is the hot path, and its shells are thin.
        hold = self._hold
        if self._reentrant:
            self._uncount()
        acquisition, inner = hold.take()
        if inner:  # a reentrant hold's other acquisitions keep it: no server call
            hold.released(True, True, self)
            return
        try:
            released = acquisition.release(exc_info)
        except BaseException as exc:
            if hold.release_failed(acquisition, exc, self):
                self._recount(hold, exc)
                raise
            return
        hold.released(released, False, self)

    def _recount(self, hold: Hold, exc: BaseException) -> None:
        """A reentrant handle's last release raised and may be retried: it holds again."""
        if self._reentrant and not isinstance(exc, LockLost):
            self._hold, self._count = hold, self._count + 1

    async def arelease(self) -> None:
        """Async :meth:`release`. Example: ``await lease.arelease()``."""
        await self._arelease(_NO_EXC)

    async def _arelease(self, exc_info: Any) -> None:
        hold = self._hold
        if self._reentrant:
            self._uncount()
        acquisition, inner = hold.take()
        if inner:
            hold.released(True, True, self)
            return
        try:
            released = await acquisition.arelease(exc_info)
        except BaseException as exc:
            if hold.release_failed(acquisition, exc, self):
                self._recount(hold, exc)
                raise
            return
        hold.released(released, False, self)

    def extend(self, ttl: float | _Default = DEFAULT) -> None:
        """Make the lease end ``ttl`` seconds from now (default: the handle's ``ttl``).

        :raises LockNotHeld: if this handle does not hold the lock.
        :raises LockLost: if the lease already ended or was taken away.
        :raises BackendUnavailable: when the server fails.

        Example: ``if lease.held_for > 20: lease.extend(30)``.
        """
        run(self._extending(ttl))

    async def aextend(self, ttl: float | _Default = DEFAULT) -> None:
        """Async :meth:`extend`. Example: ``await lease.aextend(30)``."""
        await arun(self._extending(ttl))

    def _extending(self, ttl: float | _Default) -> Core[None]:
        hold = self._hold
        ttl = hold.ttl if isinstance(ttl, _Default) else validate_ttl(ttl)
        acquisition = hold.extendable()
        sent = time.monotonic()
        try:
            grant = yield EXTEND, acquisition, ttl
        except LockLost:
            hold.mark_lost()
            raise
        hold.extended(acquisition, grant, ttl, sent)

    # -- context managers ------------------------------------------------------

    def __enter__(self) -> Self:
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

    async def __aenter__(self) -> Self:
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
        if self._hold.blocking:
            return LockTimeout(
                f"Lock {self.name!r} on {alias!r} was not acquired within {self._hold.timeout} s.",
                name=self.name,
                alias=alias,
            )
        return LockNotAcquired(
            f"Lock {self.name!r} on {alias!r} is held by someone else.", name=self.name, alias=alias
        )


def hold_of(lock: Lock[Any]) -> Hold:
    """The :class:`~django_distlock.hold.Hold` of ``lock``: the seam for the library's
    own layers (fenced writes, the Celery app, the testing kit), not the user's API."""
    return lock._hold


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline
