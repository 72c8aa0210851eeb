"""Leadership: one leader at a time per name, with an epoch that storage can check.

A term is an exclusive lock named ``leader:<name>`` on a backend that
``supports_leadership``, renewed by the watchdog while the term lasts (where locks
expire). Its :attr:`Term.epoch` is the grant's fencing token: it grows with every new
term of the name, so storage that compares numbers (``fenced_update()``, a column, a
conditional write) refuses a deposed leader's writes, which is what leader election
alone cannot do (a leader paused by GC or SIGSTOP keeps acting after another was
elected; see docs/leadership.md).

A term is *lost* as soon as leadership may have passed to another process: the lease
ran out on this process' clock, a renewal found it gone or failed until it ran out,
the ZooKeeper session was suspended or expired, an operator force-released it. Once
lost it stays lost (a term does not come back; campaign for a new one).
:meth:`Term.wait_lost` (``ahead=``: that much before the lease could end) and
:meth:`Term.on_lost` tell the leader in time to stop. :meth:`Leader.campaign` runs a
function for each term, for a process' whole life; :func:`current_leader` says who
leads. The singleton runner (``singleton.py``) keeps one child process alive per name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .context import holder_context
from .exceptions import (
    BackendUnavailable,
    LeadershipLost,
    LockLost,
    LockNotHeld,
    LockTimeout,
    UnsupportedOperation,
)
from .handle import Lock, hold_of
from .handler import DEFAULT_LOCK_ALIAS, locks
from .names import validate_name
from .values import DEFAULT, _Default, validate_timeout

if TYPE_CHECKING:
    from .backends.base import BaseLockBackend

__all__ = [
    "LEADER_PREFIX",
    "Leader",
    "LeaderInfo",
    "Leadership",
    "Term",
    "current_leader",
    "leader",
    "leadership",
]

logger = logging.getLogger("django_distlock")

#: A term of leadership ``name`` is the lock ``LEADER_PREFIX + name``.
LEADER_PREFIX = "leader:"
#: A campaign whose backend failed tries again after a pause growing from the first to
#: the last of these seconds (each drawn at random up to it: jitter), reset by a term.
_RETRY = (0.5, 1.0, 2.0, 4.0, 8.0)


def leadership(
    name: str,
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | _Default = DEFAULT,
    timeout: float | None = None,
) -> Leadership:
    """Return a context manager that leads ``name`` on alias ``using`` while it is open.

    ``with leadership("beat") as term:`` (or ``async with``) waits until this process
    leads ``name`` (other processes with the same name wait their turn), then yields
    the :class:`Term`; the exit ends the term. Nothing is sent before ``__enter__``.

    :param name: the leadership's name (any lock name); its lock is ``leader:<name>``.
    :param using: a ``DISTLOCK`` alias whose backend ``supports_leadership``.
    :param ttl: the term's lease in seconds (default: the alias' ``TTL``), renewed every
        third of it while the term lasts; the longest a dead leader's term lasts. Not
        used by ZooKeeper (its session timeout plays that part).
    :param timeout: how long ``__enter__`` waits to lead; None (the default) waits
        until it leads.
    :raises InvalidLockAlias: for an unknown alias.
    :raises InvalidLockName: for a bad name.
    :raises UnsupportedOperation: when the alias' backend cannot hold terms (no fencing
        tokens, or a lock whose loss its holder cannot learn in time), saying why.
    :raises TypeError, ValueError: for a bad ``ttl`` or ``timeout``.
    """
    return Leadership(locks[using], name, ttl=ttl, timeout=timeout)


class Leadership:
    """What :func:`leadership` returns: ``with`` it to hold a term (see there).

    Entering raises :class:`~django_distlock.exceptions.LockTimeout` when ``timeout``
    passed first, :class:`~django_distlock.exceptions.BackendUnavailable` when the
    server failed. Exiting ends the term (releases its lock) and raises
    :class:`~django_distlock.exceptions.LeadershipLost` when the term was lost and
    nobody was told (neither :attr:`Term.lost`, :meth:`Term.wait_lost` nor
    :meth:`Term.check` reported it): the block went on leading unprotected.
    """

    def __init__(
        self,
        backend: BaseLockBackend,
        name: str,
        *,
        ttl: float | _Default = DEFAULT,
        timeout: float | None = None,
    ) -> None:
        backend.refuse_unless("supports_leadership", "hold a leadership term")
        #: The leadership's name.
        self.name = validate_name(name)
        #: The ``DISTLOCK`` alias its terms are held on.
        self.alias = backend.alias
        self._timeout = validate_timeout(timeout)
        self._backend = backend
        self._ttl = ttl
        self._lock = self._new_lock()  # checks ttl before any I/O
        self._term: Term | None = None

    def _new_lock(self) -> Lock[Any]:
        """A handle of its own for each term: a term whose release failed (the server
        down) leaves its handle to its lease's end, not to the next term."""
        return self._backend.lock(
            LEADER_PREFIX + self.name, ttl=self._ttl, timeout=self._timeout, blocking=True,
            auto_renew=self._backend.supports_expiry,
        )

    def __repr__(self) -> str:
        return f"<Leadership {self.name!r} alias={self.alias!r}>"

    def __enter__(self) -> Term:
        if self._lock.held or self._lock.lost:
            self._lock = self._new_lock()
        with holder_context(f"leader of {self.name}"):
            if not self._lock.acquire():
                raise self._timed_out()
        session, sure = _session_timeout(self._lock.backend), None
        if session is not None:  # a lock without a lease: see Term._check_session
            sent = time.monotonic()
            with contextlib.suppress(LockNotHeld, BackendUnavailable):
                self._lock.extend()
                sure = sent + session
        return self._began(session, sure)

    async def __aenter__(self) -> Term:
        if self._lock.held or self._lock.lost:
            self._lock = self._new_lock()
        with holder_context(f"leader of {self.name}"):
            if not await self._lock.aacquire():
                raise self._timed_out()
        session, sure = _session_timeout(self._lock.backend), None
        if session is not None:
            sent = time.monotonic()
            with contextlib.suppress(LockNotHeld, BackendUnavailable):
                await self._lock.aextend()
                sure = sent + session
        return self._began(session, sure)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        term = self._ending()
        try:
            self._lock.release()
        except LockLost as lost:
            self._lost_at_exit(term, exc, lost)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        term = self._ending()
        try:
            await self._lock.arelease()
        except LockLost as lost:
            self._lost_at_exit(term, exc, lost)

    def _timed_out(self) -> LockTimeout:
        return LockTimeout(
            f"Did not become the leader of {self.name!r} (alias {self.alias!r}) within "
            f"{self._timeout} s: another process leads it.", name=self.name, alias=self.alias,
        )

    def _began(self, session: float | None, sure: float | None) -> Term:
        self._term = Term(self.name, self.alias, self._lock, session, sure)
        return self._term

    def _ending(self) -> Term:
        term, self._term = self._term, None
        if term is None:
            raise LockNotHeld(f"{self!r} holds no term: enter it first.")
        term._end()
        return term

    def _lost_at_exit(self, term: Term, exc: BaseException | None, lost: LockLost) -> None:
        if exc is not None or term._seen:
            return  # the block knew (or is failing anyway): nothing more to say
        raise LeadershipLost(
            f"The term {term.epoch} of leadership {self.name!r} was lost before it ended, "
            "and the leader did not check: what it did after the loss was not protected "
            "(watch term.lost, term.wait_lost() or term.on_lost())."
        ) from lost


class Term:
    """One term of a leadership: from the grant of its lock to the exit of its block.

    Built by :class:`Leadership`; the leader reads it. Thread-safe: the leader's other
    threads may wait on it. Example::

        with leadership("invoices") as term:
            while not term.wait_lost(timeout=5, ahead=1):
                Invoice.objects.filter(due=today).fenced_update(term.epoch, sent=True)
    """

    def __init__(
        self, name: str, alias: str, lock: Lock[Any], session: float | None = None,
        sure_until: float | None = None,
    ) -> None:
        #: The leadership's name.
        self.name = name
        #: The ``DISTLOCK`` alias the term is held on.
        self.alias = alias
        token = lock.fencing_token
        assert token is not None  # supports_leadership: every grant carries a token
        #: The term's number: the fencing token of its grant, higher than every earlier
        #: term's of this name. Pass it with each write (``fenced_update(term.epoch, ...)``,
        #: a column compared by storage) so that a deposed leader's writes are refused.
        self.epoch: int = token
        #: The term's lock handle (``leader:<name>``): its ``holder``, ``acquired_at``.
        self.lock = lock
        self._hold = hold_of(lock)
        self._cond = threading.Condition()
        self._over = False  # its block exited
        self._latched = False  # found lost: lost for good
        self._seen = False  # the leader was told it is lost
        self._callbacks: list[Callable[[Term], object]] = []
        self._watcher: threading.Thread | None = None
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        #: A lock that does not expire (ZooKeeper's node lives with its session): until
        #: when (monotonic) the session surely lives, from the check ``Leadership`` made
        #: at the grant (failing that: connected, kazoo has heard from the ensemble
        #: within two thirds of ``session``); each check below moves it on.
        self._sure_until: float | None = None
        self._hold.on_change = self._changed
        self._changed()  # lost between the grant and here: latch it now
        if session is not None and self._hold.valid_until is None:
            self._sure_until = sure_until or time.monotonic() + session / 3
            threading.Thread(
                target=self._check_session, args=(session,),
                name=f"distlock-term-check-{name[:40]}", daemon=True,
            ).start()

    def __repr__(self) -> str:
        state = "lost" if self._latched else "over" if self._over else "leading"
        return f"<Term {self.name!r} epoch={self.epoch} alias={self.alias!r} {state}>"

    # -- state (no I/O) ---------------------------------------------------------

    @property
    def lost(self) -> bool:
        """Whether leadership may have passed to another process (the lease ran out on
        this clock or was found gone, a renewal failed until then, the ZooKeeper session
        was suspended or expired). Once True, True for good: stop acting as the leader."""
        if self._lost_now():
            self._seen = True
            return True
        return False

    @property
    def remaining(self) -> float | None:
        """Seconds the term lasts for sure on this process' clock if no renewal (or,
        on ZooKeeper, no check of its node) succeeds from now; 0 once lost."""
        if self._lost_now():
            return 0.0
        until = self._until()
        return None if until is None else max(until - time.monotonic(), 0.0)

    def check(self) -> None:
        """Raise :class:`~django_distlock.exceptions.LeadershipLost` if the term is lost
        (or over): for a leader's loop between steps.

        :raises LeadershipLost: when :attr:`lost` is True, or the term's block exited.
        """
        if self.lost:
            raise LeadershipLost(f"{self!r}: leadership may have passed to another process.")
        if self._over:
            raise LeadershipLost(f"{self!r} is over: its block exited.")

    def _lost_now(self) -> bool:
        if self._latched:
            return True
        hold = self._hold
        sure = self._sure_until
        if hold.lost or hold.unsure or (sure is not None and time.monotonic() >= sure):
            self._latched = True
        return self._latched

    def _until(self) -> float | None:
        """The end of the lease (or of the session's sure life) on the monotonic clock."""
        until = self._hold.valid_until
        return self._sure_until if until is None else until

    def _check_session(self, session: float) -> None:
        """(a thread of the term) A lock that does not expire: ask the server every
        third of ``session`` whether the node is still this term's (one round trip). A
        yes to a request sent at ``sent`` proves the session lives until ``sent +
        session`` at least (the server restarts its timeout when it hears from us): so a
        leader paused past its session finds its term lost the moment it resumes, and a
        node deleted by an operator is found within a third of ``session``."""
        while True:
            with self._cond:
                if self._over or self._latched:
                    return
                self._cond.wait(session / 3)
                if self._over or self._latched:
                    return
            sent = time.monotonic()
            try:
                self.lock.extend()
            except LockNotHeld:  # LockLost (the hold marked lost), or released meanwhile
                return
            except BackendUnavailable:
                pass  # not moved on: the term ends at its sure end unless a check succeeds
            else:
                self._sure_until = sent + session

    # -- being told ---------------------------------------------------------------

    def wait_lost(self, timeout: float | None = None, *, ahead: float = 0.0) -> bool:
        """Wait until the term is lost, or has at most ``ahead`` seconds left unless a
        renewal succeeds, or is over; at most ``timeout`` seconds.

        Woken at once by the renewal thread or the ZooKeeper listener that finds the
        loss, and at the lease's end on this clock whatever they do (a renewal that
        hangs cannot keep the leader leading past its lease).

        :param timeout: seconds to wait at most; None: until then.
        :param ahead: seconds before the lease could end to return True at; use what
            stopping the leader's work takes. Must be under two thirds of the term's
            ``ttl`` (renewals keep that much left), or it returns True at once.
        :returns: True when the leader must stop (lost, about to be, or over); False
            when ``timeout`` passed first.
        :raises TypeError, ValueError: for a bad ``timeout`` or ``ahead``.
        """
        deadline, ahead = self._wait_bounds(timeout, ahead)
        with self._cond:
            while True:
                wake = self._stop_or_wake(deadline, ahead)
                if wake is True:
                    return True
                if wake is False:
                    return False
                self._cond.wait(None if wake is None else max(wake - time.monotonic(), 0.0))

    async def await_lost(self, timeout: float | None = None, *, ahead: float = 0.0) -> bool:
        """Async :meth:`wait_lost`: the same parameters, result and errors; the running
        event loop is woken from the thread that finds the loss."""
        deadline, ahead = self._wait_bounds(timeout, ahead)
        loop = asyncio.get_running_loop()
        while True:
            future: asyncio.Future[None] = loop.create_future()
            with self._cond:
                wake = self._stop_or_wake(deadline, ahead)
                if isinstance(wake, bool):
                    return wake
                self._futures.append((loop, future))
            try:
                delay = None if wake is None else max(wake - time.monotonic(), 0.0)
                await asyncio.wait([future], timeout=delay)
            finally:
                with self._cond:
                    if (loop, future) in self._futures:
                        self._futures.remove((loop, future))

    def on_lost(self, callback: Callable[[Term], object]) -> None:
        """Call ``callback(term)`` once when the term is lost (not when it ends by its
        block's exit), from a thread of the term's own, in the order registered; at
        once (in that thread) if it is lost already. An exception it raises is logged.

        :param callback: called with this term.
        :raises TypeError: if ``callback`` is not callable.
        """
        if not callable(callback):
            raise TypeError(f"on_lost() takes a callable, not {type(callback).__name__}.")
        with self._cond:
            self._callbacks.append(callback)
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name=f"distlock-term-{self.name[:40]}", daemon=True
                )
                self._watcher.start()

    def _watch(self) -> None:
        self.wait_lost()
        with self._cond:
            callbacks, self._callbacks = self._callbacks, []
            lost = self._latched
        if not lost:
            return  # over: its block exited
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                logger.exception("An on_lost callback of %r failed", self)
        with self._cond:  # registered while those ran: called too, now
            late, self._callbacks = self._callbacks, []
            self._watcher = None
        for callback in late:
            try:
                callback(self)
            except Exception:
                logger.exception("An on_lost callback of %r failed", self)

    @staticmethod
    def _wait_bounds(timeout: float | None, ahead: float) -> tuple[float | None, float]:
        timeout = validate_timeout(timeout)
        if isinstance(ahead, bool) or not isinstance(ahead, int | float) or not ahead >= 0:
            raise ValueError(f"ahead must be a number of seconds >= 0, got {ahead!r}.")
        return (None if timeout is None else time.monotonic() + timeout), float(ahead)

    def _stop_or_wake(self, deadline: float | None, ahead: float) -> bool | float | None:
        """(``_cond`` held) True: stop; False: the deadline passed; else when to look
        again (None: when woken)."""
        if self._lost_now():
            self._seen = True
            return True
        if self._over:
            return True
        now = time.monotonic()
        until = self._until()
        edge = None if until is None else until - ahead
        if edge is not None and now >= edge:
            return True
        if deadline is not None and now >= deadline:
            return False
        if edge is None:
            return deadline
        return edge if deadline is None else min(edge, deadline)

    def _changed(self) -> None:
        """The hold was marked lost or unsure, or the term ended (any thread)."""
        hold = self._hold
        if hold.lost or hold.unsure:
            self._latched = True
        with self._cond:
            self._cond.notify_all()
            futures = list(self._futures)
        for loop, future in futures:
            loop.call_soon_threadsafe(_settle, future)

    def _end(self) -> None:
        """Its block exits: the term is over (waiters return)."""
        self._over = True
        self._hold.on_change = None
        self._changed()


def _session_timeout(backend: BaseLockBackend) -> float | None:
    """The session timeout of a backend whose locks live with a client session instead of
    a lease (ZooKeeper's ``SESSION_TIMEOUT``), else None."""
    if backend.supports_expiry:
        return None
    session = getattr(getattr(backend, "settings", None), "session_timeout", None)
    return session if isinstance(session, float) else None


def notice(backend: BaseLockBackend, ttl: float) -> float:
    """How long before a term can pass to another its leader must have stopped, at most:
    a third of the lease (renewals come every third, so at least two thirds are left
    after each), or of a session-bound lock's session timeout (checked every third).

    :raises UnsupportedOperation: for a backend with neither (it cannot lead).
    """
    if backend.supports_expiry:
        return ttl / 3
    session = _session_timeout(backend)
    if session is None:
        raise UnsupportedOperation(
            f"{type(backend).__name__} (alias {backend.alias!r}) has neither a lease nor a "
            "session timeout: a term's end cannot be known ahead."
        )
    return session / 3


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# -- campaigning ---------------------------------------------------------------


def leader(
    name: str, *, using: str = DEFAULT_LOCK_ALIAS, ttl: float | _Default = DEFAULT
) -> Leader:
    """Return a :class:`Leader` of ``name`` on alias ``using`` (no I/O), whose
    :meth:`~Leader.campaign` leads again and again.

    :raises InvalidLockAlias, InvalidLockName, UnsupportedOperation, TypeError,
        ValueError: as :func:`leadership`.
    """
    return Leader(name, using=using, ttl=ttl)


class Leader:
    """A process' candidacy for leadership ``name``: see :meth:`campaign`."""

    def __init__(
        self, name: str, *, using: str = DEFAULT_LOCK_ALIAS, ttl: float | _Default = DEFAULT
    ) -> None:
        self._backend = locks[using]
        self._ttl = ttl
        checked = Leadership(self._backend, name, ttl=ttl)  # refused before any I/O
        #: The leadership's name.
        self.name = checked.name
        #: The ``DISTLOCK`` alias.
        self.alias = checked.alias
        #: Terms led by this candidate so far.
        self.terms = 0

    def __repr__(self) -> str:
        return f"<Leader {self.name!r} alias={self.alias!r} terms={self.terms}>"

    def campaign(
        self,
        function: Callable[[Term], object],
        *,
        stop: threading.Event | None = None,
        poll: float = 5.0,
    ) -> None:
        """Lead, run ``function(term)``, end the term, and campaign again, until ``stop``
        is set (else for ever): Curator's ``LeaderSelector`` with an epoch.

        ``function`` runs in this thread while this process leads; it must return once
        the term is lost (watch ``term.lost``, ``term.wait_lost()`` or
        ``term.check()``: a thread cannot be stopped from outside; the singleton runner
        stops a child process instead). When it returns (or raises
        :class:`~django_distlock.exceptions.LeadershipLost`) the term ends and the
        campaign goes on at once; a server failure is logged and tried again after a
        growing pause (0.5 to 8 s, jittered).

        :param function: called with each :class:`Term`.
        :param stop: set it (from any thread or a signal handler) to end the campaign:
            between terms, or while waiting to lead, within ``poll`` seconds.
        :param poll: the longest a wait to lead goes on before ``stop`` is looked at
            (each wait asks the server again: a blocking wait is not interrupted).
        :raises Exception: what ``function`` raises (but LeadershipLost) ends the
            campaign, after its term ended.
        """
        if not callable(function):
            raise TypeError(f"campaign() takes a callable, not {type(function).__name__}.")
        poll = validate_timeout(poll) or 0.0
        if poll <= 0:
            raise ValueError(f"poll must be a number of seconds > 0, got {poll!r}.")
        failures = 0
        leading = Leadership(
            self._backend, self.name, ttl=self._ttl, timeout=None if stop is None else poll
        )
        while stop is None or not stop.is_set():
            try:
                with leading as term:
                    failures = 0
                    self.terms += 1
                    logger.info("%r began term %d", self, term.epoch)
                    try:
                        function(term)
                    except LeadershipLost:
                        pass
                    finally:
                        logger.info("%r ended term %d (lost: %s)", self, term.epoch, term.lost)
            except LockTimeout:
                continue  # stop is looked at; the wait goes on
            except LeadershipLost:
                logger.warning("%r lost term unchecked", self, exc_info=True)
            except BackendUnavailable as exc:
                pause = random.uniform(0, _RETRY[min(failures, len(_RETRY) - 1)])
                failures += 1
                logger.warning("%r: the lock server failed (%s); campaigning again in %.1f s",
                               self, exc, pause)
                logger.debug("%r: the failure", self, exc_info=True)
                if stop is not None:
                    stop.wait(pause)
                else:
                    time.sleep(pause)


# -- who leads -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """Who leads a name now, as :func:`current_leader` reads it from the backend."""

    name: str
    alias: str
    #: The term's epoch (its grant's fencing token).
    epoch: int | None
    host: str
    pid: int | None
    #: The leader's thread (and asyncio task).
    thread: str
    #: Server time the term began.
    since: datetime | None
    #: Server time its lease ends unless renewed (None: it does not expire).
    expires_at: datetime | None


def current_leader(name: str, *, using: str = DEFAULT_LOCK_ALIAS) -> LeaderInfo | None:
    """Who leads ``name`` on alias ``using`` now, or None (nobody does). One listing
    call (the admin's held-locks page and ``manage.py distlock list`` show the same
    lock, ``leader:<name>``).

    :raises InvalidLockAlias, InvalidLockName: for a bad alias or name.
    :raises UnsupportedOperation: when the backend cannot hold terms or list its locks.
    :raises BackendUnavailable: when the server failed.
    """
    backend = locks[using]
    backend.refuse_unless("supports_leadership", "hold a leadership term")
    key = LEADER_PREFIX + validate_name(name)
    cursor = None
    while True:  # one page, unless other names begin with this one and come first
        page = backend.held_locks(prefix=key, limit=50, cursor=cursor)
        for info in page.locks:
            if info.name == key:
                return LeaderInfo(
                    name=name, alias=backend.alias, epoch=info.fencing_token, host=info.host,
                    pid=info.pid, thread=info.thread, since=info.acquired_at,
                    expires_at=info.expires_at,
                )
        cursor = page.next_cursor
        if cursor is None:
            return None
