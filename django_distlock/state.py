"""The state of a lock handle, and its changes: what :class:`~django_distlock.handle.Lock`
holds (the acquisition, its grant, the lease's local end, the reentrant depth), and
whether it is lost or its release unsure. Every change happens under the handle's
mutex and sends its signal here; the calls that reach the backend are the handle's
(``handle.py``), which is the only class built on this one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from . import holders, signals
from .exceptions import LockLost, LockNotHeld
from .renewal import Renewal, watch
from .values import Grant, short_owner

if TYPE_CHECKING:
    from .backends.base import Acquisition, BaseLockBackend
    from .handle import Lock

logger = logging.getLogger("django_distlock")


class HandleState:
    """The state half of :class:`~django_distlock.handle.Lock` (see the module)."""

    # The handle's options, set by ``Lock.__init__`` before this one runs.
    backend: BaseLockBackend
    name: str
    key: str
    kind: str
    ttl: float
    auto_renew: bool
    _owner_token: str | None
    #: The process that acquired (the handle's holder metadata).
    pid: int | None

    def __init__(self) -> None:
        #: The watchdog's entry while it renews this handle's lease (else None).
        self.renewal: Renewal | None = None
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
        self._held_ref: weakref.ref[Any] | None = None

    # -- state -----------------------------------------------------------------

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
    def holder(self) -> object:
        """Who acquired it: the thread or asyncio task (``holders.current_holder()``),
        an object equal only for the same one; None before any acquisition."""
        return self._holder

    @property
    def owner_id(self) -> str | None:
        """A short, non-secret id of the owner token of the current (or last) grant, as
        listings show it (None before any)."""
        return self._owner_id

    def _check_process(self) -> None:
        if self.pid != os.getpid():
            raise LockNotHeld(
                f"{self!r} was acquired by process {self.pid}; this process ({os.getpid()}) "
                "was forked from it and cannot use, release or extend that lease."
            )

    def __repr__(self) -> str:
        state = "lost" if self._lost else "held" if self._token else "free"
        name = self.name if len(self.name) <= 100 else self.name[:100] + "…"
        return (
            f"<Lock alias={self.backend.alias!r} name={name!r} {state} "
            f"owner={self.owner_id} fencing_token={self.fencing_token}>"
        )

    # -- loss and signals ------------------------------------------------------

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
        if not signal.receivers:  # the common case: build no arguments for nobody
            return
        signal.send(
            sender=type(self.backend),
            backend=self.backend,
            alias=self.backend.alias,
            name=self.name,
            fencing_token=self.fencing_token,
            handle=self,
            **extra,
        )

    def _send_lost(self) -> None:
        """Record the loss found by a release; signal it unless it was known already."""
        if self._lost:
            return
        self._lost = True
        self._send(signals.lock_lost)

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

    # -- grant and release -----------------------------------------------------

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
            self.renewal = watch(cast("Lock", self), acquisition, asynchronous)
        self._held_ref = holders.hold(self, self._holder)
        self._granted_at = time.monotonic()
        self._send(signals.lock_acquired, waited=self._granted_at - self._started)
        return True

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


    def _extendable(self) -> Acquisition:
        """Start an extend: the acquisition held, or raise LockNotHeld or LockLost."""
        acquisition = self._acquisition
        if self._token is None or acquisition is None:
            raise LockNotHeld(f"{self!r} is not held by this handle.")
        self._check_process()
        if self.lost:
            self.mark_lost()
            raise LockLost(f"{self!r} was lost.")
        return acquisition

    def _extended(
        self, acquisition: Acquisition, grant: Grant | None, ttl: float, sent: float
    ) -> None:
        if grant is None:
            self.mark_lost()
            raise LockLost(f"{self!r} could not be extended: its lease already ended.")
        with self._mutex:
            if self._acquisition is acquisition:
                self._grant = grant
                expires = grant.expires_at is not None
                self._valid_until = sent + grant.granted_after + ttl if expires else None

    # -- the watchdog's side (renewal.py) --------------------------------------

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

    def renewal_lost(self, acquisition: Acquisition) -> bool:
        """Mark the handle lost, its lease having run out before a renewal succeeded, if
        ``acquisition`` is still its own.

        :param acquisition: the acquisition the watchdog renews.
        :returns: whether the handle is lost (False: released meanwhile, not a loss).
        """
        return self._lose(acquisition, "its lease ran out before a renewal succeeded")

    def _renewed(
        self, acquisition: Acquisition, grant: Grant | None, ttl: float, sent: float,
        until: float | None,
    ) -> bool | None:
        """After the watchdog's extend: what :meth:`~django_distlock.handle.Lock.renew`
        returns."""
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
