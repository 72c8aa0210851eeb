"""The acquisition of a reader, a writer or a permit in lease mode (``shares.py`` has the
design; docs/database.md the whole story).

On PostgreSQL each attempt is one call of ``django_distlock_share_grant``. A thread that
will wait joins the name's queue in the server (it sleeps in ``pg_advisory_lock`` behind
the waiters before it, then listens on the name's channel); as the head it waits for
a notification, which the release that frees the name sends, then attempts again: a
hand-off costs the notification and one call, no poll. :data:`HEAD_POLL` bounds that
wait only in case a wake-up was missed. On SQLite, and for asyncio tasks, waiters poll
with backoff and jitter.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, ClassVar

from ...backoff import remaining
from ...exceptions import BackendUnavailable, SemaphoreLimitMismatch
from ...values import short_owner
from ..base import Acquisition, ExcInfo, Grant, Miss
from .backend import server_wait
from .errors import ERRORS, is_busy
from .sessions import SHARES_BELL, Session
from .shares import in_transaction, pg_call
from .shares_sql import (
    INTENT_SECONDS,
    PG_ENQUEUE,
    PG_EXTEND,
    PG_GRANT,
    PG_JOIN,
    PG_LEAVE,
    PG_RELEASE,
    SENTINEL,
    SQLITE_SHARES,
    WRITER_SUFFIX,
)
from .sql import POSTGRESQL, SQLITE, as_datetime, sqlite_ttl

if TYPE_CHECKING:
    from ...hold import Hold
    from .lease import LeaseBackend
    from .shares import Run

#: PostgreSQL: the longest the head of a name's queue waits for a release's wake-up
#: before it looks again (a fallback: the release that frees the name notifies it, and
#: a lease's end is known from the miss). A waiting writer looks at least every
#: ``INTENT_SECONDS / 2`` to renew its mark.
HEAD_POLL = 2.0


class DatabaseKindAcquisition(Acquisition):
    """One acquisition of a reader or a permit (a share of the name's row)."""

    backend: LeaseBackend
    #: A write lock's (:class:`DatabaseWriteAcquisition`): its owner carries a suffix in
    #: the row, it marks its intent while it waits, and it holds the row alone.
    writer: ClassVar[bool] = False

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        #: SQLite's statements (PostgreSQL calls its routines instead).
        self.sql = SQLITE_SHARES
        self.pg = self.backend.vendor == "postgresql"
        #: The owner as the row stores it (a writer's token carries a suffix).
        self.owner = self.token + WRITER_SUFFIX if self.writer else self.token
        self.marked = False
        #: PostgreSQL: this acquisition heads the name's queue (its session holds it).
        self.queued = False
        #: An asyncio task's attempts: they do not queue in the server (their calls share
        #: one thread), so they may pass the queue rather than starve behind it.
        self.barging = False
        #: PostgreSQL: the session holding the grant's advisory lock (a share's hold of
        #: the name's bell, a writer's generation lock), which its release gives back
        #: (that wakes a ``lock()`` waiter), and a writer's generation.
        self.granted_on: Session | None = None
        self.generation: int | None = None

    # -- attempts ------------------------------------------------------------------

    def attempt(self) -> Grant | Miss:
        try:
            if self.pg:
                outcome = self._pg_attempt()
            else:
                params = self._params()
                outcome = in_transaction(self.backend, "acquiring a lock",
                                         lambda run: self._attempt(run, params), self.deadline)
        except BackendUnavailable as exc:
            if exc.__cause__ is not None and is_busy(exc.__cause__):
                return Miss()  # the row was locked past the session's lock wait
            raise
        if isinstance(outcome, SemaphoreLimitMismatch):
            raise outcome
        return outcome

    async def aattempt(self) -> Grant | Miss:
        self.barging = True
        return await super().aattempt()

    def _pg_attempt(self) -> Grant | Miss | SemaphoreLimitMismatch:
        hold = self.hold
        params = {"key": hold.key, "owner": self.owner, "kind": hold.kind, "ttl": hold.ttl,
                  "limit": hold.limit, "host": hold.host, "pid": hold.pid,
                  "thread": hold.holder_field, "pass": self.queued or self.barging,
                  "head": self.queued, "mark": self._marks()}
        [row] = pg_call(self.backend, "acquiring a lock", PG_GRANT, params, self.deadline)
        granted, fencing, acquired_at, expires_at, retry_after, stored, generation = row
        if granted:
            self.queued = False  # the call left the queue: the next waiter heads it
            self.marked = False  # a writer's grant cleared its mark
            # This session holds the share's bell, or the writer's generation lock.
            if generation is not None or not self.writer:
                self.granted_on, self.generation = self.backend.sessions.current(), generation
            return Grant(fencing, as_datetime(acquired_at), as_datetime(expires_at))
        if stored is not None:
            return limit_mismatch(hold, stored)
        if params["mark"]:
            self.marked = True  # keeps new readers out while this writer waits
        return Miss(retry_after)

    def _marks(self) -> bool:
        """Whether a miss of this writer marks the row: one that will wait and heads the
        queue, or polls (an asyncio task). A first attempt of a thread must not: it will
        queue behind the head, which its mark would keep out."""
        return self.writer and self.blocking and (self.queued or self.barging)

    def _params(self) -> dict[str, Any]:
        hold = self.hold
        return {"key": hold.key, "owner": self.owner, "ttl": sqlite_ttl(hold.ttl),
                "host": hold.host, "pid": hold.pid, "thread": hold.holder_field,
                "limit": hold.limit, "kind": hold.kind, "sentinel": SENTINEL.get(hold.kind)}

    def _attempt(self, run: Run, params: dict[str, Any]) -> Grant | Miss | SemaphoreLimitMismatch:
        """SQLite: one attempt, statement by statement, in one transaction."""
        sql = self.sql
        run(sql.lock_row, params)
        if self.writer:
            rows = run(sql.grant_write, params)
            if rows:
                self.marked = False  # the grant cleared the writer's mark
                fencing, acquired_at, expires_at = rows[0]
                return Grant(fencing, as_datetime(acquired_at), as_datetime(expires_at))
        else:
            rows = run(sql.grant_share, params)
            if rows:
                fencing, acquired_at, expires_at = rows[0]
                run(sql.insert_share, {**params, "fencing": fencing,
                                       "acquired_at": acquired_at, "expires_at": expires_at})
                return Grant(fencing, as_datetime(acquired_at), as_datetime(expires_at))
        found = run(sql.missed, params)
        retry_after, stored = found[0] if found else (None, None)
        if stored is not None:
            return limit_mismatch(self.hold, stored)
        if self.writer and self.blocking:
            # Keep new readers out while this writer waits (writers are not starved).
            run(sql.mark_intent, params)
            self.marked = True
        return Miss(retry_after)

    # -- waiting -------------------------------------------------------------------

    def wait(self, miss: Miss) -> Grant | None:
        if not self.pg:
            return super().wait(miss)  # SQLite: poll
        if not self.queued:
            self._join()
        else:
            self._await_wake(miss)
        return None  # attempt again

    def _join(self) -> None:
        """Sleep in the server behind the waiters before this one until it heads the
        name's queue (the head's grant, or its giving up, wakes the next one)."""
        hold = self.hold
        params = {"key": hold.key, "wait": server_wait(self.deadline)}
        who = {"key": hold.key, "kind": hold.kind, "owner": short_owner(self.token),
               "host": hold.host, "pid": hold.pid, "thread": hold.holder_field}
        try:
            pg_call(self.backend, "waiting for a lock", PG_ENQUEUE, who, self.deadline)
            rows = pg_call(self.backend, "waiting for a lock", PG_JOIN, params, self.deadline)
        except BackendUnavailable as exc:
            if exc.__cause__ is None or not is_busy(exc.__cause__):
                raise
            return
        self.queued = bool(rows and rows[0][0])

    def _await_wake(self, miss: Miss) -> None:
        """The head: wait for the name's notification (a release freed it), the lease
        that blocks it to end, or :data:`HEAD_POLL`, whichever comes first."""
        timeout = HEAD_POLL if not self.marked else min(HEAD_POLL, INTENT_SECONDS / 2)
        if miss.retry_after is not None:
            timeout = min(timeout, max(miss.retry_after, 0.0) + 0.001)
        left = remaining(self.deadline)
        if left is not None:
            timeout = min(timeout, max(left, 0.0))
        session = self.backend.sessions.current()
        raw: Any = session.wrapper.connection if session is not None else None
        if session is None or not session.usable or not _listens(raw):
            super().wait(miss)  # psycopg2: no waiting for notifications here; poll
            return
        try:
            with session.mutex:
                notes = raw.notifies(timeout=timeout, stop_after=1)
                try:
                    for _ in notes:
                        break
                finally:
                    notes.close()
        except ERRORS:
            # The connection broke: its queue lock went with it; join again.
            self.backend.sessions.forget(session)
            self.queued = False

    def close(self) -> None:
        if not (self.queued or self.marked):
            return
        queued, marked = self.queued, self.marked
        self.queued = self.marked = False
        params = {"key": self.hold.key, "queued": queued, "owner": self.owner if marked else None}
        with contextlib.suppress(BackendUnavailable):  # its session is gone, the mark lapses
            if self.pg:
                pg_call(self.backend, "leaving a lock's queue", PG_LEAVE, params)
            else:
                self.backend.run(self.sql.drop_intent, params, "leaving a lock's queue",
                                 fetch=False)

    # -- holding -------------------------------------------------------------------

    def release(self, exc_info: ExcInfo) -> bool:
        if self.writer:
            return self._release_write()
        params = {"key": self.hold.key, "owner": self.owner}
        if self.pg:
            rows = pg_call(self.backend, "releasing a lock", PG_RELEASE,
                           {**params, "bell": self._held_here()}, self._bound())
            return bool(rows and rows[0][0])

        def steps(run: Run) -> bool:
            run(self.sql.lock_row, params)
            rows = run(self.sql.release_share, params)
            run(self.sql.recompute, params)
            return any(row[0] for row in rows)

        return in_transaction(self.backend, "releasing a lock", steps, self._bound())

    def _release_write(self) -> bool:
        """A writer is the row's holder: the exclusive release (on PostgreSQL it hands the
        name over to a waiting ``lock()``'s reservation, gives the generation lock back
        and wakes the head of the name's queue)."""
        if self.pg:
            generation = self.generation if self._held_here() else None
            statement, args = POSTGRESQL.release, [self.hold.key, self.owner, generation]
        else:
            statement, args = SQLITE.release, [self.hold.key, self.owner]
        rows = self.backend.run(statement, args, "releasing a lock")
        return bool(rows and rows[0][0])

    def _held_here(self) -> bool:
        """Whether this thread's session holds the grant's advisory lock (the release
        gives it back); if another session holds it, that one gives it back before its
        next statement."""
        held_on, self.granted_on = self.granted_on, None
        if held_on is None:
            return False
        if held_on is self.backend.sessions.current() and held_on.usable:
            return True
        if held_on.usable:
            lock_id = SHARES_BELL if self.generation is None else self.generation
            held_on.orphans.append((self.hold.key, lock_id))
        return False

    def extend(self, ttl: float) -> Grant | None:
        key = self.hold.key
        if self.writer:
            dialect = POSTGRESQL if self.pg else SQLITE
            ttl_arg: float | str = ttl if self.pg else sqlite_ttl(ttl)
            rows = self.backend.run(dialect.extend, [ttl_arg, key, self.owner],
                                    "extending a lock")
        elif self.pg:
            rows = pg_call(self.backend, "extending a lock", PG_EXTEND,
                           {"key": key, "owner": self.owner, "ttl": ttl}, self._bound())
            rows = [row for row in rows if row[0] is not None]
        else:
            params = {"key": key, "owner": self.owner, "ttl": sqlite_ttl(ttl)}

            def steps(run: Run) -> list[Any]:
                run(self.sql.lock_row, params)
                found = run(self.sql.extend_share, params)
                run(self.sql.recompute, params)
                return found

            rows = in_transaction(self.backend, "extending a lock", steps, self._bound())
        if not rows:
            return None
        fencing, acquired_at, expires_at = rows[0]
        return Grant(fencing, as_datetime(acquired_at), as_datetime(expires_at))

    def _bound(self) -> float | None:
        """Until when a release or an extend waits for a frozen server: the lease's end;
        a call for a lease already over gets the watchdog's grace from now (as the
        exclusive release: watched until a past moment, every call would be cut at once)."""
        until = self.hold.valid_until
        return None if until is None else max(time.monotonic(), until)


def limit_mismatch(hold: Hold, stored: int) -> SemaphoreLimitMismatch:
    """The error of a semaphore acquire whose limit is not the one the name stores."""
    given = hold.limit
    return SemaphoreLimitMismatch(
        f"The stored limit of the semaphore {hold.name!r} is {stored}; this "
        f"client gave {given}: every client of a semaphore must use the same limit "
        "(the stored one binds while any permit of the name is held).",
        stored=int(stored), given=given,
    )


def _listens(raw: Any) -> bool:
    """Whether ``raw`` is a psycopg 3 connection (whose ``notifies()`` waits)."""
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(raw, psycopg.Connection)


class DatabaseWriteAcquisition(DatabaseKindAcquisition):
    """One acquisition of a write lock (lease mode)."""

    writer = True
