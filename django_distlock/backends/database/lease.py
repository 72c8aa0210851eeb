"""Lease mode: the row records the owner and an expiry from the database's clock.

Each operation is one autocommit statement or procedure call. On PostgreSQL and MySQL
they run on sessions of the backend's own (see ``sessions.py``), so a lease never joins,
and is never rolled back with, the caller's transaction; a waiter queues in the server
and the release wakes it there (docs/database.md). On SQLite waiters back off with
jitter.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from django.db import connections

from ...kinds import Kind
from ...values import short_owner
from ..base import (
    Acquisition,
    ExcInfo,
    Freed,
    Grant,
    HeldCount,
    LockInfo,
    LockPage,
    Miss,
    OrderedPage,
    WaiterInfo,
)
from .backend import DatabaseBackend, server_wait
from .errors import ERRORS, is_busy, is_deadlock, refused_wait, statement_cancelled
from .mysql_sql import MYSQL
from .mysql_sql import WAIT as MYSQL_WAIT
from .ordered import held_by_age
from .session_acquisition import OwnSessionAcquisition, OwnSessionBackend
from .sessions import (
    Call,
    CallCancelled,
    Session,
    retry_row_waits,
)
from .share_acquisition import DatabaseKindAcquisition, DatabaseWriteAcquisition, limit_mismatch
from .shares import force_release, kind_of_owner, with_shares
from .shares_sql import WRITER_SUFFIX
from .sql import (
    PG_WAIT,
    PG_WITHDRAW,
    POSTGRESQL,
    Dialect,
    acquire_params,
    as_datetime,
    release_params,
    sqlite_ttl,
    upper_bound,
)
from .waiting import count_waiters, read_waiters

T = TypeVar("T")
logger = logging.getLogger("django_distlock")


class LeaseBackend(OwnSessionBackend, mode="lease"):
    """The database backend's lease mode (``OPTIONS["MODE"] = "lease"``, the default)."""

    supports_expiry = True
    supports_leadership = True
    supports_listing = True
    supports_counting = True
    supports_force_release = True
    supports_force_release_by_owner = True
    supports_waiters = True
    supports_age_order = True

    @classmethod
    def for_vendor(cls, vendor: str) -> type[DatabaseBackend]:
        return {"sqlite": SqliteLeaseBackend, "mysql": MySqlLeaseBackend}.get(vendor, cls)

    def is_locked(self, name: str) -> bool:
        return bool(self.run(self.dialect.is_locked, [self.make_key(name)], "checking a lock"))

    def _held_locks(self, prefix: str, limit: int, cursor: str | None) -> LockPage:
        low = self.key_prefix + prefix
        params = [cursor or "", low, upper_bound(low), limit]
        rows = self.run(self.dialect.held, params, "listing locks")
        infos = [info for _, info in self.page_infos(rows)]
        return LockPage(infos, rows[-1][0] if len(rows) == limit else None)

    def page_infos(self, rows: list[Any]) -> list[tuple[str, LockInfo]]:
        """A listing page's rows as (storage key, lock) in the rows' order."""
        # A name held by readers or permits shows every live share (one more call).
        # PostgreSQL: how many wait in its queues (one more statement).
        counts = count_waiters(self, [row[0] for row in rows]) if self.supports_waiters else {}
        return [
            (row[0], replace(self._info(row), waiters=counts.get(row[0])))
            for row in with_shares(self, rows)
        ]

    def _held_locks_by_age(
        self, order: str, prefix: str, limit: int, after: tuple[str, str] | None
    ) -> OrderedPage:
        return held_by_age(self, order, prefix, limit, after)

    def _count_held(self, prefix: str, limit: int) -> HeldCount:
        # The listing's own query (same index, same predicate), stopped one past the cap.
        low = self.key_prefix + prefix
        statement = f"SELECT count(*) FROM ({self.dialect.held}) AS counted"
        rows = self.run(statement, ["", low, upper_bound(low), limit + 1], "counting locks")
        found = int(rows[0][0])
        return HeldCount(min(found, limit), found <= limit)

    def _waiters(self, key: str, limit: int) -> list[WaiterInfo]:
        return read_waiters(self, key, limit)

    def _info(self, row: tuple[Any, ...]) -> LockInfo:
        key, owner, fencing, acquired_at, expires_at, host, pid, thread = row[:8]
        return LockInfo(
            alias=self.alias,
            name=self.name_of(key),
            owner=short_owner(owner),
            fencing_token=fencing,
            acquired_at=as_datetime(acquired_at),
            expires_at=as_datetime(expires_at),
            host=host,
            pid=pid,
            thread=thread,
            kind=row[8] if len(row) > 8 else kind_of_owner(owner),
        )

    def _force_release(self, key: str, owner: str) -> Freed | None:
        return force_release(self, key, owner)

class SqliteLeaseBackend(LeaseBackend):
    """Lease mode on SQLite: waiters poll with backoff, in no queue; the statements run on
    Django's connection, in the caller's transaction when one is open."""

    supports_waiters = False
    # A connection of the backend's own cannot keep leases apart from the caller's
    # transaction on SQLite: that transaction holds the database's write lock (taken at
    # BEGIN IMMEDIATE, or at its first write), so the other connection's write waits
    # for it until the busy timeout; one that got in first (a DEFERRED transaction that
    # had only read) makes the caller's next write fail instead.
    leases_join_transaction = True
    why_unsupported = {
        **LeaseBackend.why_unsupported,
        "supports_waiters": "its waiters poll with backoff in their own processes; SQLite "
        "keeps no queue of them",
    }

    def in_caller_transaction(self) -> bool:
        connection = connections[self.database]
        # Django's atomic() block, or autocommit turned off by the caller (a connection
        # not yet opened is in autocommit when it opens).
        return connection.in_atomic_block or (
            connection.connection is not None and not connection.autocommit
        )


class MySqlLeaseBackend(LeaseBackend):
    """Lease mode on MySQL and MariaDB (InnoDB): the row decides, as on PostgreSQL;
    waiters of every kind queue in the server on named locks (``GET_LOCK``), which order
    and wake them but never grant (sql/mysql.sql)."""

    def _force_release(self, key: str, owner: str) -> Freed | None:
        rows = self.run(self.dialect.force_release, [key, owner], "force-releasing a lock")
        return Freed() if rows else None


class SqliteLeaseAcquisition(Acquisition):
    """SQLite: one statement per attempt on Django's connection; waits back off."""

    backend: LeaseBackend

    def attempt(self) -> Grant | Miss:
        lock, dialect = self.hold, self.backend.dialect
        ttl = sqlite_ttl(lock.ttl)
        params = [lock.key, self.token, ttl, lock.host, lock.pid, lock.holder_field]
        assert dialect.retry_after is not None  # SQLite's
        try:
            with connections[self.backend.database].cursor() as cursor:
                cursor.execute(dialect.acquire, params)
                row = cursor.fetchone()
                if row is None:
                    # The miss path's second statement (local, cheap).
                    cursor.execute(dialect.retry_after, [lock.key])
                    found = cursor.fetchone()
                    return Miss(found[0] if found else None)
        except ERRORS as exc:
            if is_busy(exc):
                return Miss()
            raise self.backend.errors.translate(
                exc, "acquiring a lock", self.backend.where) from exc
        _, fencing, acquired_at, expires_at, _, _ = row
        return Grant(fencing, as_datetime(acquired_at), as_datetime(expires_at))

    def release(self, exc_info: ExcInfo) -> bool:
        params = [self.hold.key, self.token]
        rows = self.backend.run(self.backend.dialect.release, params, "releasing a lock")
        return bool(rows and rows[0][0])

    def extend(self, ttl: float) -> Grant | None:
        params = [sqlite_ttl(ttl), self.hold.key, self.token]
        return _extended(self.backend.run(self.backend.dialect.extend, params, "extending a lock"))


class SessionLeaseAcquisition(OwnSessionAcquisition):
    """PostgreSQL and MySQL: an attempt is one statement; a wait is one call of the wait
    procedure (queue in the server, be woken, or handed the lock, by the release).

    A thread uses its own session; an asyncio task takes one from the backend's
    pool for the whole acquisition and runs its calls in the pool's threads.
    The session that was granted the lock holds the grant's generation lock,
    which the release gives back (that wakes the next waiter).
    """

    backend: LeaseBackend
    #: The vendor's statements: ``acquire``, ``release``, ``extend``.
    dialect: ClassVar[Dialect]
    #: The blocking wait's call. Params: key, owner, ttl, host, pid, thread, seconds.
    wait_statement: ClassVar[str]
    #: Takes back the reservation a cancelled wait may have left in the row (params: key,
    #: owner); None where a wait reserves nothing.
    withdraw_statement: ClassVar[str | None]

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        #: The owner as the row (or the share) stores it: a writer's carries a suffix
        #: (MySQL: this class serves every kind there).
        self.owner = self.token + WRITER_SUFFIX if self.hold.kind == Kind.WRITE else self.token
        #: The session that holds the grant's generation lock (after a grant).
        self.granted_on: Session | None = None
        self.generation: int | None = None
        self.queued = False

    def release(self, exc_info: ExcInfo) -> bool:
        try:
            return self._retried(self._release_on, self._release_bound())
        finally:
            self._give_back()

    def _release_bound(self) -> float:
        """Until when a release may wait for the server (monotonic; the watchdog adds its
        grace): the lease's local end, after which the lock frees itself; a release of a
        lease already over gets the grace alone."""
        until = self.hold.valid_until
        now = time.monotonic()
        return max(now, now + self.hold.ttl if until is None else until)

    def extend(self, ttl: float) -> Grant | None:
        # A frozen server must not hold an extend (the renewal thread's, say) past the
        # lease it extends: after that, there is nothing left to extend.
        until = self.hold.valid_until
        until = time.monotonic() + ttl if until is None else until

        def extend_on(session: Session) -> Grant | None:
            return self._call(session, "extending a lock", lambda: _extended(
                session.execute(self.dialect.extend, [ttl, self.hold.key, self.owner])
                .fetchall()), until)

        return self._retried(extend_on, until)

    # -- the statements ----------------------------------------------------------

    def wait_params(self, seconds: float | None) -> list[object]:
        """The parameters of ``wait_statement``, waiting ``seconds`` at most."""
        hold = self.hold
        return [hold.key, self.owner, hold.ttl, hold.host, hold.pid, hold.holder_field,
                seconds]

    def _attempt_on(self, session: Session) -> Grant | Miss:
        hold = self.hold
        if self.queued or (self.blocking and session.contended(hold.key)):
            return Miss()  # known contended: the wait queues (and grants if free)
        params = acquire_params(hold.key, self.owner, hold.ttl, hold.host, hold.pid,
                                hold.holder_field, kind=hold.kind, limit=hold.limit)
        try:
            with session.mutex, self._watched(session):
                row = session.execute(self.dialect.acquire, params).fetchone()
        except ERRORS as exc:
            if is_busy(exc) and not session.timed_out:
                return Miss()
            self._drop(session)
            raise self.backend.errors.translate(
                exc, "acquiring a lock", self.backend.where) from exc
        if row is None:
            return Miss()
        granted, fencing, acquired_at, expires_at, retry_after, generation = row[:6]
        if len(row) > 6 and row[6] is not None:  # MySQL: a semaphore's other stored limit
            raise limit_mismatch(hold, row[6])
        if not granted:
            return Miss(retry_after)
        return self._grant(session, fencing, acquired_at, expires_at, generation, 0.0)

    def _wait_on(self, session: Session, call: Call) -> Grant | None:
        hold = self.hold
        self.queued = True
        session.note_contended(hold.key)
        params = self.wait_params(server_wait(self.deadline))
        try:
            with session.mutex, self._watched(session), call.running_on(session):
                try:
                    row = session.execute(self.wait_statement, params).fetchone()
                except ERRORS:
                    raise
                except BaseException:
                    # Interrupted (KeyboardInterrupt, say): stop the call in the server
                    # (it would wait on, and may be handed the lock); the session is
                    # closed below, which frees the queue and the head's advisory locks.
                    call.cancel()
                    raise
        except CallCancelled:
            return None  # its task was cancelled before the wait was sent
        except ERRORS as exc:
            if call.cancelled and statement_cancelled(exc) and not session.timed_out:
                self._withdraw(session)
            # The session may still hold the queue's advisory lock: closing it frees that.
            self._drop(session)
            if is_busy(exc) and not session.timed_out:  # a grant waited too long for a row
                return None
            if is_deadlock(exc):  # MariaDB: the queue's named locks closed a cycle
                raise refused_wait(self.backend.where, hold.name, self.backend.alias,
                                   exc) from exc
            raise self.backend.errors.translate(
                exc, "waiting for a lock", self.backend.where) from exc
        except BaseException:
            self._drop(session)
            raise
        granted, fencing, acquired_at, expires_at, granted_after, generation = row[:6]
        if len(row) > 6 and row[6] is not None:  # MySQL: a semaphore's other stored limit
            raise limit_mismatch(hold, row[6])
        if not granted:
            return None
        return self._grant(session, fencing, acquired_at, expires_at, generation, granted_after)

    def _withdraw(self, session: Session) -> None:
        """After a wait its task cancelled: take back the reservation it may have left in
        the row, then release a grant it may have been handed (by a release before the
        cancel landed, or committed just before it), both on the wait's session.

        While that session lives it holds the waiter's liveness lock, and a release hands
        the lock to a reserved head whose liveness lock is held. Closing the session ends
        it a moment later (the server has to see the close): a release in that moment
        would hand the name to a task that is gone, held then for its ttl. The withdrawal
        commits first, so no handover comes after it; the release frees one that came.
        Best effort within the watchdog's grace: the session is closed next anyway."""
        key, token = self.hold.key, self.owner
        bound = time.monotonic()
        try:
            with session.mutex, self._watched(session, bound):
                if self.withdraw_statement is not None:
                    session.execute(self.withdraw_statement, [key, token])
                retry_row_waits(lambda: session.execute(
                    self.dialect.release, release_params(key, token, None)).fetchall(),
                    bound)
        except ERRORS:
            logger.warning("Withdrawing the cancelled wait of %r failed; a release may hand "
                           "it the lock until its session ends", self.hold, exc_info=True)

    def _grant(
        self, session: Session, fencing: int, acquired_at: Any, expires_at: Any,
        generation: int | None, granted_after: float | None,
    ) -> Grant:
        if generation is not None:
            self.granted_on, self.generation = session, generation
        return Grant(
            fencing, as_datetime(acquired_at), as_datetime(expires_at),
            granted_after or 0.0,
        )

    def _release_on(self, session: Session) -> bool:
        """Release through ``session``; the generation lock lives on the granting session,
        so go through that one when it is idle (else leave the lock to be given back
        before its next statement)."""
        held_on = self.granted_on
        if held_on is not None and held_on is not session:
            released = self._release_through(held_on)
            if released is not None:
                return released
        generation = self.generation if held_on is session else None
        params = release_params(self.hold.key, self.owner, generation)
        bound = self._release_bound()
        rows = self._call(session, "releasing a lock", lambda: retry_row_waits(
            lambda: session.execute(self.dialect.release, params).fetchall(), bound), bound)
        return bool(rows and rows[0][0])

    def _release_through(self, session: Session) -> bool | None:
        assert self.generation is not None
        if not session.usable:
            return None  # its connection is gone, and its locks with it
        if not session.mutex.acquire(blocking=False):
            session.orphans.append((self.hold.key, self.generation))
            return None
        try:
            params = release_params(self.hold.key, self.owner, self.generation)
            with self._watched(session, bound := self._release_bound()):
                row = retry_row_waits(
                    lambda: session.execute(self.dialect.release, params).fetchone(), bound)
            return bool(row and row[0])
        except ERRORS:
            # That connection broke, or was cut for not answering (its locks go with it
            # once the server sees it): release through ours, under its own bound.
            return None
        finally:
            session.mutex.release()


class PgLeaseAcquisition(SessionLeaseAcquisition):
    """PostgreSQL: the wait reserves the row, and the release hands it over."""

    dialect = POSTGRESQL
    wait_statement = PG_WAIT
    withdraw_statement = PG_WITHDRAW


class MySqlLeaseAcquisition(SessionLeaseAcquisition):
    """MySQL and MariaDB, every kind: the head of the name's one queue takes the name
    when the release of the grant in its way (or that lease's end) wakes it; a wait
    reserves nothing. A writer's owner carries a suffix in the row; a reader or a permit
    is a share (sql/mysql.sql)."""

    dialect = MYSQL
    wait_statement = MYSQL_WAIT
    withdraw_statement = None

    def wait_params(self, seconds: float | None) -> list[object]:
        hold = self.hold
        return [hold.key, self.owner, hold.kind, hold.limit, hold.ttl, hold.host, hold.pid,
                hold.holder_field, seconds]


def _extended(rows: list[Any]) -> Grant | None:
    if not rows:
        return None
    fencing, acquired_at, expires_at = rows[0]
    return Grant(fencing, as_datetime(acquired_at), as_datetime(expires_at))


def _kinds(exclusive: type[Acquisition]) -> dict[Kind, type[Acquisition]]:
    return {
        Kind.EXCLUSIVE: exclusive,
        Kind.READ: DatabaseKindAcquisition,
        Kind.WRITE: DatabaseWriteAcquisition,
        Kind.SEMAPHORE: DatabaseKindAcquisition,
    }


# Set here, below the acquisition classes (the backends come first in this module).
LeaseBackend.kinds = _kinds(PgLeaseAcquisition)
SqliteLeaseBackend.kinds = _kinds(SqliteLeaseAcquisition)
MySqlLeaseBackend.kinds = dict.fromkeys(Kind, MySqlLeaseAcquisition)
