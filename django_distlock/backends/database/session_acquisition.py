"""Acquisitions whose statements run on the database backend's own sessions
(PostgreSQL, MySQL): lease mode's and session mode's.

A thread's calls run on a session of the backend's (lease mode: the thread's own;
session mode: one taken for the acquisition); an asyncio task takes one from the
backend's pool (``AsyncSessions``) for the whole acquisition and runs its calls in the
pool's threads, so its waits in the server never block the loop. A task cancelled
while a call may grant leaves the call to finish in its thread, which releases what it
was granted: nothing is left held by nobody.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ...backoff import remaining
from ...exceptions import BackendUnavailable
from ..base import Acquisition, ExcInfo, Grant, Miss
from .backend import DatabaseBackend
from .errors import ERRORS, connection_lost, did_not_answer
from .sessions import AsyncSessions, Call, Session, watched

T = TypeVar("T")


class OwnSessionBackend(DatabaseBackend):
    """A database backend mode whose statements run on sessions of its own: it keeps a
    pool of them for asyncio tasks (``OPTIONS["ASYNC_SESSIONS"]`` per event loop)."""

    def __init__(self, alias: str, params: Any) -> None:
        super().__init__(alias, params)
        self.async_pool = AsyncSessions(self.session_factory, self.async_sessions)

    def close(self) -> None:
        self.async_pool.close()
        super().close()


class OwnSessionAcquisition(Acquisition):
    """An acquisition whose attempt and wait are each one call on a session of the
    backend's own; a subclass writes :meth:`_attempt_on`, :meth:`_wait_on`, ``release``
    and ``extend``.

    A thread uses :meth:`_session` (lease mode: its own); an asyncio task takes one from
    the backend's pool for the whole acquisition and runs its calls in the pool's
    threads.
    """

    backend: OwnSessionBackend
    # Class-level defaults, set on the instance when they change (no __init__ of its own:
    # one Python call fewer on the hot path, counted by benchmarks/hops_budget.json).
    #: An asyncio task's session (session mode: a thread's too), and the loop it was
    #: taken on.
    taken: Session | None = None
    loop: asyncio.AbstractEventLoop | None = None
    #: A cancelled task left its wait running in the server: the wait's end gives the
    #: session back (and releases a grant that came all the same).
    abandoned = False

    def attempt(self) -> Grant | Miss:
        return self._retried(self._attempt_on, self.deadline)

    def wait(self, miss: Miss) -> Grant | None:
        return self._retried(lambda session: self._wait_on(session, Call()), self.deadline)

    @abc.abstractmethod
    def _attempt_on(self, session: Session) -> Grant | Miss:
        """One attempt on ``session`` (it does not wait for another holder)."""

    @abc.abstractmethod
    def _wait_on(self, session: Session, call: Call) -> Grant | None:
        """One wait in the server on ``session`` until the deadline (``call`` lets a
        cancelled task stop it there): the grant, or None."""

    def _retried(self, op: Callable[[Session], T], bound: float | None = None) -> T:
        """Run ``op`` on this acquisition's session; if the connection turns out lost
        (the server restarted, the session was terminated), once more on a new one. A
        session opened for it connects by ``bound`` (the call's deadline) + the grace."""
        session = self._session(bound)
        try:
            return op(session)
        except BackendUnavailable as exc:
            if session.timed_out:
                raise did_not_answer(self.backend.where) from exc
            if not connection_lost(exc.__cause__):
                raise
        return op(self._session(bound))  # the lost session was closed by op's error handling

    def _session(self, bound: float | None = None) -> Session:
        """The task's pooled session (reopened if it was closed), or this thread's; one
        opened now connects by ``bound`` + the grace."""
        try:
            if self.taken is None:
                return self.backend.sessions.get(bound)
            if not self.taken.usable:
                self.taken.close()
                self.taken = self.backend.session_factory.open(bound)
            return self.taken
        except ERRORS as exc:
            raise self.backend.errors.translate(exc, "connecting", self.backend.where) from exc

    # -- async: a session of the pool, calls in its threads ----------------------

    async def aattempt(self) -> Grant | Miss:
        if self.taken is None:
            pool = self.backend.async_pool
            timeout = remaining(self.deadline) if self.blocking else 0.0
            session = await pool.take(None if timeout is None else max(timeout, 0.0))
            if session is None:
                return Miss()  # every session of this event loop is busy
            self.taken, self.loop = session, asyncio.get_running_loop()
        return await self._pooled(lambda: self._retried(self._attempt_on), Miss())

    async def async_wait(self, miss: Miss) -> Grant | None:
        if self.taken is None:  # no session came: wait for one in the next attempt
            return await super().async_wait(miss)
        # Cancelled, the call goes on in the server: stop it there (that call only: the
        # session's next statement may be the release of a grant that came meanwhile).
        call = Call()
        return await self._pooled(lambda: self._retried(lambda s: self._wait_on(s, call)),
                                  None, lambda: threading.Thread(target=call.cancel,
                                                                 daemon=True).start())

    async def _pooled(self, call: Callable[[], T], nothing: T,
                      on_cancel: Callable[[], None] | None = None) -> T:
        """Run ``call`` (which may grant) on the task's session in the pool's threads.
        A task cancelled meanwhile leaves the session to the call's thread: when the
        call ends, that thread releases a grant it made and gives the session back,
        so neither is left to nobody (a lease held for its ttl, a session in two
        threads)."""
        mutex, state = threading.Lock(), {"abandoned": False, "delivered": False}

        def run() -> T:
            outcome: object = None
            try:
                outcome = call()
                return cast(T, outcome)
            finally:
                with mutex:
                    abandoned = state["abandoned"]
                    state["delivered"] = not abandoned
                if abandoned:
                    self._settle(outcome)

        future = asyncio.ensure_future(self.backend.async_pool.run(run))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.abandoned = True  # aclose leaves the session to the call's end
            with mutex:
                state["abandoned"] = True
                delivered = state["delivered"]
            if delivered:  # it ended before we knew: settle its outcome here
                try:
                    outcome = await asyncio.shield(future)
                except Exception:
                    outcome = None
                await self.backend.async_pool.run(lambda: self._settle(outcome))
            elif on_cancel is not None:
                on_cancel()
            raise

    def _settle(self, outcome: object) -> None:
        """After a cancelled task's call: release its grant, or give its session back."""
        if isinstance(outcome, Grant):
            self._release_abandoned()  # gives the session back
        else:
            self._give_back()

    async def aclose(self) -> None:
        if not self.abandoned:
            self._give_back()

    async def arelease(self, exc_info: ExcInfo) -> bool:
        if self.taken is None:
            return await super().arelease(exc_info)
        return await self.backend.async_pool.run(lambda: self.release(exc_info))

    async def aextend(self, ttl: float) -> Grant | None:
        if self.taken is None:
            return await super().aextend(ttl)
        return await self.backend.async_pool.run(lambda: self.extend(ttl))

    def _give_back(self) -> None:
        taken, self.taken = self.taken, None
        if taken is not None and self.loop is not None:
            self.backend.async_pool.give_back(taken, self.loop)

    # -- calls -------------------------------------------------------------------

    def _call(self, session: Session, doing: str, func: Callable[[], T],
              bound: float | None = None) -> T:
        """Run ``func`` holding the session, its connection cut past ``bound`` (monotonic)
        plus the grace (None: no bound); a failure closes the session (the server frees
        its advisory locks) and is BackendUnavailable."""
        try:
            with session.mutex, watched(session, bound):
                return func()
        except ERRORS as exc:
            self._drop(session)
            raise self.backend.errors.translate(exc, doing, self.backend.where) from exc

    def _drop(self, session: Session) -> None:
        if session is self.taken:
            session.close()
        else:
            self.backend.sessions.forget(session)

    def _watched(self, session: Session,
                 deadline: float | None = None) -> contextlib.AbstractContextManager[None]:
        """Cut the call's connection if the server has not answered by ``deadline`` (by
        default the acquire's) plus a grace: a frozen server must not hold an acquire
        past its timeout. Hold the session's mutex around it."""
        return watched(session, self.deadline if deadline is None else deadline)
