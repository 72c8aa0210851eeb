"""What a lock handle holds: the request (name, kind, TTL, holder metadata) and the
state of its acquisition (the grant, the lease's local end, the reentrant depth, lost
or not), changed only under its mutex, each change sending its signal here.

:class:`Hold` is the seam between the user's :class:`~django_distlock.handle.Lock`
and the rest of the library: a backend's :class:`~django_distlock.backends.base.Acquisition`
reads the request from it and calls :meth:`Hold.mark_lost`; the watchdog
(``renewal.py``) renews through it. The user sees none of it: ``Lock`` (``handle.py``)
makes the calls to the backend and shows the documented API.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from . import holders, ordering, signals
from .context import current_context
from .exceptions import DistLockError, LockLost, LockNotHeld
from .kinds import Kind
from .renewal import Renewal, watch
from .steps import EXTEND, Core, arun, run
from .values import SHORT_OWNER, Grant, _Default, join_holder, validate_timeout

if TYPE_CHECKING:
    from .backends.acquisition import Acquisition
    from .circuit import Circuit

logger = logging.getLogger("django_distlock")

_HOST = socket.gethostname()


class LockBackend(Protocol):
    """What the handle layer uses of its backend (every
    :class:`~django_distlock.backends.base.BaseLockBackend` is one): declared here so
    that the handle layer does not name the backends' base class, which builds it."""

    @property
    def alias(self) -> str:
        """The ``DISTLOCK`` alias."""

    @property
    def supports_downgrade(self) -> bool:
        """Whether a write holder may take its name's read side at once."""

    @property
    def circuit(self) -> Circuit:
        """The alias' ``FAIL_FAST`` circuit in this process."""

    def acquisition(
        self, hold: Hold, token: str, blocking: bool, deadline: float | None
    ) -> Acquisition:
        """A new acquisition of ``hold`` (no I/O)."""

    def is_locked(self, name: str) -> bool:
        """Whether anyone holds ``name`` now."""


class Hold:
    """What one lock handle holds (see the module): built by the handle, read by its
    backend's acquisitions, renewed by the watchdog."""

    # The state's starting values, at class level (set on the instance when they change:
    # a handle is built per acquisition, and some 20 stores fewer count on the hot path).
    #: Holder metadata of the current acquisition: host, pid, thread/task, and what
    #: the holder is doing (request path, task name; ``context.py``), or "".
    host = _HOST
    pid: int | None = None
    thread = ""
    context = ""
    #: The thread label and the context as backends store them (``join_holder``).
    holder_field = ""
    #: The watchdog's entry while it renews this handle's lease (else None).
    renewal: Renewal | None = None
    #: Set by a backend while it cannot tell whether the lock is still held (a
    #: ZooKeeper session suspended: the connection dropped and the session may
    #: yet expire); stop writing until it turns False again, or ``lost`` True.
    #: Changed through :meth:`set_unsure` once granted.
    unsure = False
    #: Called (no arguments, in the thread that found it) when the hold is marked
    #: lost or turns unsure: a leadership term's (``leadership.py``) wake-up.
    on_change: Callable[[], None] | None = None
    _acquisition: Acquisition | None = None
    _token: str | None = None
    _owner_id: str | None = None
    _grant: Grant | None = None
    _lost = False
    #: Held by the thread reporting a loss (``_lose``) from the mark until its signal
    #: was sent: a release that finds the mark waits on it (``_send_lost``).
    _reporting: threading.RLock | None = None
    #: An acquire is under way (``Lock.acquire``'s loop clears it at its end).
    busy = False
    _valid_until: float | None = None  # monotonic, conservative
    _lost_at_release = False
    #: A release sent while the lease was valid raised (BackendUnavailable): it may
    #: have gone through. A later release that finds the lock gone is no loss.
    _release_unsure = False
    _started = 0.0
    _granted_at: float | None = None  # monotonic, of the first grant
    _depth = 0  # acquisitions held by this handle (above 1 only when reentrant)
    #: Who acquired it (``current_holder()``), and its entry among the held handles.
    _holder: object = None
    _held_ref: weakref.ref[Any] | None = None

    def __init__(
        self,
        handle: object,
        backend: LockBackend,
        name: str,
        key: str,
        *,
        kind: Kind,
        limit: int | None,
        ttl: float,
        timeout: float | None,
        blocking: bool,
        reentrant: bool,
        auto_renew: bool,
        max_hold: float | None,
        owner_token: str | None,
        order_class: str | None = None,
    ) -> None:
        #: The user's handle, for the signals (weakly: a dropped handle is let go).
        self._handle = weakref.ref(handle)
        self.backend = backend
        self.name = name
        #: The backend's key for ``name``.
        self.key = key
        #: ``"exclusive"``, ``"read"``, ``"write"`` or ``"semaphore"``.
        self.kind = kind
        #: How many holders a ``"semaphore"`` name admits (else None).
        self.limit = limit
        #: The lease's length in seconds (the handle's ``ttl``).
        self.ttl = ttl
        #: How long, and whether, ``acquire()`` waits by default.
        self.timeout = timeout
        self.blocking = blocking
        #: Whether acquiring again while held counts up instead of failing.
        self.reentrant = reentrant
        #: Whether the watchdog renews the lease while held, for at most ``max_hold``
        #: seconds from the grant.
        self.auto_renew = auto_renew
        self.max_hold = max_hold
        self._owner_token = owner_token
        #: The lock's class for the lock-order checker (``ordering.py``): ``order_class=``
        #: or ``@distlock``'s template; None: derived from the name when needed.
        self.order_class = order_class
        self._mutex = threading.Lock()

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
        """:attr:`Lock.lost <django_distlock.Lock.lost>`: the loss reported, or the lease
        run out on this process' monotonic clock (:attr:`valid_until`)."""
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

    def check_process(self) -> None:
        """Raise LockNotHeld in a process forked from the one that acquired."""
        if self.pid != os.getpid():
            raise LockNotHeld(
                f"{self!r} was acquired by process {self.pid}; this process ({os.getpid()}) "
                "was forked from it and cannot use, release or extend that lease."
            )

    def __repr__(self) -> str:  # the user's handle shows this one
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
            # Renew no more before the loss shows: whoever sees the handle lost (the
            # holder, a test) also sees it off the watchdog's schedule, not a moment
            # later (the contract's check of it failed once on that window).
            self.stop_renewal()
            self._lost = True
            let_go = self._release_unsure
            self._reporting = reporting = threading.RLock()
            reporting.acquire()
        try:
            if let_go:  # a release that raised was sent in time: not a loss
                self._forget()
                return True
            if why:
                logger.warning("Lock %r was lost: %s.", self, why)
            self._forget()  # stop renewing; a new handle may wait for the name
            self._changed()
            self._send(signals.lock_lost)
            return True
        finally:
            reporting.release()

    def set_unsure(self, unsure: bool) -> None:
        """Record whether the backend can tell that the lock is still held (a ZooKeeper
        session suspended, then reconnected): :attr:`unsure`, told to :attr:`on_change`."""
        self.unsure = unsure
        if unsure:
            self._changed()

    def _changed(self) -> None:
        callback = self.on_change
        if callback is not None:
            callback()

    def _send(self, signal: Any, handle: object = None, **extra: Any) -> None:
        """Send ``signal`` for ``handle`` (None: the handle that built this hold)."""
        if not signal.receivers:  # the common case: build no arguments for nobody
            return
        signal.send(
            sender=type(self.backend),
            backend=self.backend,
            alias=self.backend.alias,
            name=self.name,
            fencing_token=self.fencing_token,
            handle=self._handle() if handle is None else handle,
            **extra,
        )

    def not_acquired(self) -> None:
        """Send :data:`~django_distlock.signals.lock_not_acquired` (an acquire missed)."""
        self._send(signals.lock_not_acquired, waited=time.monotonic() - self._started)

    def acquire_failed(self, error: BaseException) -> None:
        """Send :data:`~django_distlock.signals.lock_acquire_failed` (an acquire raised
        ``error``)."""
        self._send(signals.lock_acquire_failed, waited=time.monotonic() - self._started,
                   error=error)

    def _send_lost(self) -> None:
        """Record the loss found by a release; signal it unless it was known already
        (then return once that report was sent: the release's LockLost comes after the
        signal, whichever thread reports it; a receiver on that thread may release)."""
        if self._lost:
            reporting = self._reporting
            if reporting is not None:
                with reporting:
                    pass
            return
        self._lost = True
        self._changed()
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

    # -- acquire, release, extend (the handle's steps) -------------------------

    def begin(
        self, blocking: bool | None, timeout: float | _Default | None
    ) -> tuple[bool, float | None]:
        """Start an acquire (``Lock.acquire``'s arguments); return whether it blocks, and
        its deadline on :func:`time.monotonic`'s clock (None: none).

        :raises TypeError, ValueError: for a bad ``blocking`` or ``timeout``.
        :raises DistLockError: if an acquire is under way, or the handle holds the lock
            (a reentrant handle's acquire by its holder counts before it gets here).
        :raises LockLost: if the handle held the lock and lost it, unreleased.
        :raises SelfDeadlock: if, blocking, the same thread or task holds the name
            through another handle (not a reentrant one: that acquire counts).
        """
        blocking = self.blocking if blocking is None else blocking
        if not isinstance(blocking, bool):
            raise TypeError("blocking must be True or False.")
        timeout = self.timeout if isinstance(timeout, _Default) else validate_timeout(timeout)
        holder, label = holders.identify()
        with self._mutex:
            if self.busy or self._token is not None:
                if self._lost and not self.busy:
                    raise LockLost(f"{self!r} was lost; release() it before acquiring again.")
                raise DistLockError(
                    f"{self!r} is already acquired or being acquired; a handle holds one "
                    "acquisition at a time (build another handle with .lock(), or pass "
                    "reentrant=True: its holder's thread or task then acquires it again, "
                    "counted)."
                )
            if blocking:
                holders.refuse(self, holder, self.backend.supports_downgrade)
                if ordering.MODE is not False:  # the checker's off (False) costs no call
                    ordering.check(self, holder)
            self._holder = holder
            self.busy = True
        self.pid = os.getpid()
        self.thread = label
        self.context = current_context()
        self.holder_field = join_holder(self.thread, self.context)
        self._started = started = time.monotonic()
        return blocking, None if timeout is None or not blocking else started + timeout

    def new_token(self) -> str:
        """The owner token of the next acquisition: the explicit owner's, or 128 new
        random bits."""
        # What secrets.token_hex(16) returns (os.urandom's bits, in hex), without its two
        # Python frames: each frame entered between two round trips costs the acquire
        # about a microsecond on a shared core (docs/plans/issue-35.md, §20).
        return self._owner_token or os.urandom(16).hex()

    @property
    def shares_owner(self) -> bool:
        """Whether the handle was given an ``owner`` that handles share (the server
        counts their acquisitions: ``supports_shared_owner``)."""
        return self._owner_token is not None

    def reenter(self, handle: object) -> bool:
        """Count one more acquisition of this hold by its holder (a reentrant handle's
        acquire, :meth:`Lock.acquire <django_distlock.Lock.acquire>`): no server call.

        :param handle: the handle acquiring (the signal's ``handle``).
        :returns: False when the hold is no longer held here (released, lost, a lease
            run out, a forked child): the handle acquires as usual.
        """
        with self._mutex:
            if self._token is None or self._lost or self.pid != os.getpid():
                return False
            if self._expired_locally():
                return False
            self._depth += 1
        self._send(signals.lock_acquired, handle, waited=0.0)
        return True

    def granted(
        self, acquisition: Acquisition, grant: Grant, sent: float, asynchronous: bool
    ) -> bool:
        """Record a grant; False if its lease already ran out on this process' clock."""
        valid_until = None
        if grant.expires_at is not None:
            valid_until = sent + grant.granted_after + self.ttl
            if time.monotonic() >= valid_until:
                return False
        with self._mutex:
            self._depth = 1
            self._acquisition = acquisition
            self._token = acquisition.token
            self._owner_id = acquisition.token[:SHORT_OWNER]  # short_owner(), inlined
            self._grant = grant
            self._lost = False
            self._release_unsure = False
            self._valid_until = valid_until
        if self.auto_renew:
            self.renewal = watch(self, acquisition, asynchronous)
        self._held_ref = holders.hold(self, self._holder)
        self._granted_at = time.monotonic()
        if signals.lock_acquired.receivers:  # as _send() checks, without its call
            self._send(signals.lock_acquired, waited=self._granted_at - self._started)
        return True

    def take(self) -> tuple[Acquisition, bool]:
        """Start a release: the acquisition, and whether an outer acquisition of a
        reentrant handle stays held after it."""
        with self._mutex:
            acquisition = self._acquisition
            if self._token is None or acquisition is None:
                raise LockNotHeld(f"{self!r} is not held by this handle.")
            if self.pid != os.getpid():
                self.check_process()  # raises
            # Seen as lost during the release: keep it, so the release raises (not after
            # a release sent in time that raised: a lease that ended since is no loss).
            # (_expired_locally() and _clear() written out: the hot path.)
            until = self._valid_until
            self._lost_at_release = not self._release_unsure and (
                self._lost or (until is not None and time.monotonic() >= until)
            )
            inner = self._depth > 1
            if inner:
                self._depth -= 1
            else:
                self._token = self._acquisition = None
                self._depth = 0
        return acquisition, inner

    def _clear(self) -> None:
        """Hold nothing (call with ``_mutex`` held)."""
        self._token = None
        self._acquisition = None
        self._depth = 0

    def _expired_locally(self) -> bool:
        return self._valid_until is not None and time.monotonic() >= self._valid_until

    def release_failed(self, acquisition: Acquisition, exc: BaseException, handle: object) -> bool:
        """After the backend's release (the last acquisition's) raised ``exc``, for
        ``handle``: return whether to raise it."""
        if isinstance(exc, LockLost):
            with self._mutex:
                self._clear()
            self._forget()
            if self._release_unsure:
                self._already_released(handle)
                return False
            self._send_lost()
            return True
        with self._mutex:  # still held: the caller may release again
            self._token = acquisition.token
            self._acquisition = acquisition
            self._depth = 1
            # Set with the token, so that a mark_lost() from another thread (a session
            # listener) sees both or neither.
            self._release_unsure = not self._lost_at_release
        # Whether the release reached the server is unknown: the thread no longer counts
        # as the holder (refusing its next wait with SelfDeadlock for good is worse than a
        # wait that may end at its timeout), and renewing a lease its holder let go of
        # would keep it past its TTL.
        self._forget()
        return True

    def released(self, released: bool, inner: bool, handle: object) -> None:
        """After the backend's release returned ``released`` (an inner release of a
        reentrant hold calls no server: True), for ``handle``: record it, or raise
        LockLost."""
        lost = not released or self._lost_at_release
        if inner:  # the hold's other acquisitions keep it (lost or not) until the last
            if lost:
                self._send_lost()
                raise LockLost(f"{self!r} was lost before this release.")
            self._send(signals.lock_released, handle)
            return
        with self._mutex:  # _clear() written out: the hot path
            self._token = self._acquisition = None
            self._depth = 0
        self._forget()
        if lost and self._release_unsure and not inner:
            self._already_released(handle)
            return
        if lost:
            self._send_lost()
            raise LockLost(f"{self!r} was no longer held when released: its lease ended.")
        self._release_unsure = False
        if signals.lock_released.receivers:  # as _send() checks, without its call
            self._send(signals.lock_released, handle)

    def _already_released(self, handle: object = None) -> None:
        """A retried release found the lock gone after a release that was sent while the
        lease was valid and raised: that release went through, or the lease ended after
        the holder let go. Either way no critical section ran unprotected: no loss."""
        self._release_unsure = False
        logger.info(
            "%r was already released when release() was retried: the release that raised "
            "went through, or its lease ended after it was sent.", self,
        )
        self._send(signals.lock_released, handle)

    def extendable(self) -> Acquisition:
        """Start an extend: the acquisition held, or raise LockNotHeld or LockLost."""
        acquisition = self._acquisition
        if self._token is None or acquisition is None:
            raise LockNotHeld(f"{self!r} is not held by this handle.")
        self.check_process()
        if self.lost:
            self.mark_lost()
            raise LockLost(f"{self!r} was lost.")
        return acquisition

    def extended(
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
        self._send(signals.lock_renewed)

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
        """After the watchdog's extend: what :meth:`renew`
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
        self._send(signals.lock_renewed)
        return True

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
        return self._renewed(acquisition, grant, ttl, sent, until)
