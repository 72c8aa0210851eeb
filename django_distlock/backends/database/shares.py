"""Lease mode's read-write locks and semaphores (``read_lock``, ``write_lock``,
``semaphore``), on PostgreSQL and SQLite.

Each grant, release and extend is one short transaction that locks the name's row
first (``shares_sql.py`` says why that makes the count of live shares exact). A
reader or a permit is a row of ``django_distlock_share`` with its own expiry; a
writer holds the name's row as an exclusive holder does, so ``lock(name)`` and
``write_lock(name)`` exclude each other and share one fencing counter. On PostgreSQL,
waiting threads queue in the server on an advisory lock of the name (not the
exclusive lock's queue) and the head polls; on SQLite, and for asyncio tasks, every
waiter polls with backoff and jitter. A waiting writer marks the row, and the mark
keeps new readers out until it is granted, gives up, or stops renewing it
(docs/database.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections, transaction

from ...exceptions import BackendUnavailable, SemaphoreLimitMismatch
from ..base import Acquisition, ExcInfo, Freed, Grant, Miss
from .backend import is_busy, server_wait
from .sessions import ERRORS, WATCHDOG, Session, connection_lost
from .shares_sql import (
    PERMITS,
    PG_JOIN_QUEUE,
    PG_LEAVE_QUEUE,
    PG_QUEUE_WAIT,
    PG_SHARES,
    READERS,
    SENTINEL,
    SQLITE_SHARES,
    WRITER_SUFFIX,
    ShareDialect,
)
from .sql import POSTGRESQL, SQLITE, as_datetime, sqlite_ttl

if TYPE_CHECKING:
    from .lease import LeaseBackend

T = TypeVar("T")
#: Runs one statement of a transaction and returns its rows.
Run = Callable[[str, dict[str, Any]], list[Any]]


def share_dialect(backend: LeaseBackend) -> ShareDialect:
    """The share statements of ``backend``'s vendor."""
    return PG_SHARES if backend.vendor == "postgresql" else SQLITE_SHARES


def in_transaction(
    backend: LeaseBackend, doing: str, steps: Callable[[Run], T], deadline: float | None = None
) -> T:
    """Run ``steps`` in one transaction apart from the caller's (PostgreSQL: this thread's
    session of the backend, once more on a new one if its connection was lost; SQLite:
    Django's connection, a savepoint inside the caller's block as its lease statements).

    :param deadline: PostgreSQL: when the watchdog cuts a server that does not answer
        (monotonic, plus its grace; None: never).
    :raises BackendUnavailable: when the database fails (its error chained).
    """
    if backend.vendor != "postgresql":
        try:
            with transaction.atomic(using=backend.database), \
                    connections[backend.database].cursor() as cursor:
                def run(statement: str, params: dict[str, Any]) -> list[Any]:
                    cursor.execute(statement, params)
                    return cursor.fetchall() if cursor.description else []

                return steps(run)
        except ERRORS as exc:
            raise backend.unavailable(exc, doing) from exc
    for last in (False, True):
        session: Session | None = None
        try:
            session = backend.sessions.get()
            return _on_session(session, steps, deadline)
        except ERRORS as exc:
            if is_busy(exc) and not (session and session.timed_out):
                raise backend.unavailable(exc, doing) from exc  # rolled back; session usable
            backend.sessions.forget()
            if session is not None and session.timed_out:
                raise BackendUnavailable(
                    f"Database {backend.database!r} did not answer within the timeout "
                    f"(lock alias {backend.alias!r}); its connection was cut."
                ) from exc
            if last or not connection_lost(exc):
                raise backend.unavailable(exc, doing) from exc
            # The session was gone (terminated, the server restarted): once more.
    raise AssertionError("unreachable")


def _on_session(session: Session, steps: Callable[[Run], T], deadline: float | None) -> T:
    """Run ``steps`` between ``BEGIN`` and ``COMMIT`` on ``session`` (rolled back if it
    raises), watched until ``deadline``."""
    cursor = session.cursor

    def run(statement: str, params: dict[str, Any]) -> list[Any]:
        found = session.execute(statement, params)
        return found.fetchall() if found.description else []

    with session.mutex:
        ident = None if deadline is None else WATCHDOG.watch(session, deadline)
        try:
            cursor.execute("BEGIN", prepare=False)
            try:
                result = steps(run)
                cursor.execute("COMMIT", prepare=False)
            except BaseException:
                with contextlib.suppress(*ERRORS):
                    cursor.execute("ROLLBACK", prepare=False)
                raise
            return result
        finally:
            if ident is not None:
                WATCHDOG.done(ident)


def kind_of_owner(owner: str) -> str:
    """The kind of lock a row's ``owner`` holds.

    :param owner: the ``owner`` column of a held row.
    :returns: ``"exclusive"``, ``"write"``, ``"read"`` or ``"semaphore"``.
    """
    if owner == READERS:
        return "read"
    if owner == PERMITS:
        return "semaphore"
    return "write" if owner.endswith(WRITER_SUFFIX) else "exclusive"


def listed_shares(backend: LeaseBackend, keys: list[str]) -> list[Any]:
    """The live shares of the names ``keys``.

    :param backend: the lease backend.
    :param keys: storage keys whose rows show readers or permits.
    :returns: rows (name, owner, fencing, acquired_at, expires_at, host, pid, thread,
        kind), the share of each name that ends last after its others.
    :raises BackendUnavailable: when the database fails.
    """
    names = ", ".join(f"%(n{index})s" for index in range(len(keys)))
    statement = share_dialect(backend).listed.format(names=names)
    params = {f"n{index}": key for index, key in enumerate(keys)}
    return backend.run(statement, params, "listing locks")


def force_release(backend: LeaseBackend, key: str, owner: str) -> Freed | None:
    """Free the name ``key``: its holder, or its readers or permits.

    :param backend: the lease backend.
    :param key: the storage key.
    :param owner: free only the holder or share whose short owner id this is ("": all).
    :returns: :class:`Freed`, or None when nothing held was freed.
    :raises BackendUnavailable: when the database fails.
    """
    sql = share_dialect(backend)
    params = {"key": key, "length": len(owner), "expected": owner}

    def steps(run: Run) -> Freed | None:
        run(sql.lock_row, params)
        shares = run(sql.force_shares, params)
        # The holder's row: an exclusive holder or a writer whose id matches, or the
        # readers or permits as a whole when any owner goes.
        held = run(sql.force_row, params)
        run(sql.recompute, params)
        return Freed() if held or shares else None

    return in_transaction(backend, "force-releasing a lock", steps)


class KindAcquisition(Acquisition):
    """One acquisition of a reader, a writer or a permit. Its head of queue (PostgreSQL
    threads), and every waiter elsewhere, polls with the base class' backoff and jitter,
    bounded by the acquire's timeout and the holder's expiry."""

    backend: LeaseBackend

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sql = share_dialect(self.backend)
        self.pg = self.backend.vendor == "postgresql"
        lock = self.lock
        #: The owner as the row stores it (a writer's token carries a suffix).
        self.owner = self.token + WRITER_SUFFIX if lock.kind == "write" else self.token
        self.marked = False
        #: PostgreSQL: this acquisition heads the name's queue (its session holds it).
        self.queued = False
        #: An asyncio task's attempts: they do not queue in the server (their calls share
        #: one thread), so they may pass the queue rather than starve behind it.
        self.barging = False

    def _ttl(self, seconds: float) -> float | str:
        return seconds if self.pg else sqlite_ttl(seconds)

    def _params(self) -> dict[str, Any]:
        lock = self.lock
        return {"key": lock.key, "owner": self.owner, "ttl": self._ttl(lock.ttl),
                "host": lock.host, "pid": lock.pid, "thread": lock.holder_field,
                "limit": lock.limit, "kind": lock.kind, "sentinel": SENTINEL.get(lock.kind),
                "queued": self.queued or self.barging}

    def attempt(self) -> Grant | Miss:
        params = self._params()
        try:
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

    def wait(self, miss: Miss) -> Grant | None:
        if not self.pg or self.queued:
            return super().wait(miss)  # SQLite, or the head: poll
        # Sleep in the server behind the waiters before this one, until it heads the
        # name's queue (the head's grant, or its giving up, wakes the next one).
        wait = f"{max(int(server_wait(self.deadline) * 1000), 1)}ms"

        def join(run: Run) -> None:
            run(PG_QUEUE_WAIT, {"wait": wait})
            run(PG_JOIN_QUEUE, {"key": self.lock.key})

        try:
            in_transaction(self.backend, "waiting for a lock", join, self.deadline)
        except BackendUnavailable as exc:
            if exc.__cause__ is None or not is_busy(exc.__cause__):
                raise
            self._leave()  # a lock granted just as its wait timed out is kept
            return None
        self.queued = True
        return None

    def _leave(self) -> None:
        """Give back the queue's lock if this thread's session holds it."""
        self.queued = False
        self.backend.run(PG_LEAVE_QUEUE, {"key": self.lock.key}, "leaving a lock's queue")

    def _attempt(self, run: Run, params: dict[str, Any]) -> Grant | Miss | SemaphoreLimitMismatch:
        sql = self.sql
        run(sql.lock_row, params)
        if self.lock.kind == "write":
            rows = run(sql.grant_write, params)
            if rows:
                self.marked = False  # the grant cleared the writer's mark
                self._granted(run)
                fencing, acquired_at, expires_at = rows[0]
                return Grant(fencing, as_datetime(acquired_at), as_datetime(expires_at))
        else:
            rows = run(sql.grant_share, params)
            if rows:
                fencing, acquired_at, expires_at = rows[0]
                run(sql.insert_share, {**params, "fencing": fencing,
                                       "acquired_at": acquired_at, "expires_at": expires_at})
                self._granted(run)
                return Grant(fencing, as_datetime(acquired_at), as_datetime(expires_at))
        found = run(sql.missed, params)
        retry_after, stored = found[0] if found else (None, None)
        if stored is not None:
            given = self.lock.limit
            return SemaphoreLimitMismatch(
                f"The stored limit of the semaphore {self.lock.name!r} is {stored}; this "
                f"client gave {given}: every client of a semaphore must use the same limit "
                "(the stored one binds while any permit of the name is held).",
                stored=int(stored), given=given,
            )
        if self.lock.kind == "write" and self.blocking:
            # Keep new readers out while this writer waits (writers are not starved).
            run(sql.mark_intent, params)
            self.marked = True
        return Miss(retry_after)

    def _granted(self, run: Run) -> None:
        """A grant to the queue's head: the next waiter heads the queue (at the commit)."""
        if self.queued:
            run(PG_LEAVE_QUEUE, {"key": self.lock.key})
            self.queued = False

    def close(self) -> None:
        if self.queued:
            with contextlib.suppress(BackendUnavailable):  # its session is gone, and the lock
                self._leave()
        if self.marked:
            self.marked = False
            params = {"key": self.lock.key, "owner": self.owner}
            with contextlib.suppress(BackendUnavailable):  # the mark lapses by itself
                self.backend.run(self.sql.drop_intent, params, "leaving a lock's queue",
                                 fetch=False)

    def release(self, exc_info: ExcInfo) -> bool:
        if self.lock.kind == "write":
            return self._release_write()
        params = {"key": self.lock.key, "owner": self.owner}

        def steps(run: Run) -> bool:
            run(self.sql.lock_row, params)
            rows = run(self.sql.release_share, params)
            run(self.sql.recompute, params)
            return any(row[0] for row in rows)

        return in_transaction(self.backend, "releasing a lock", steps, self._bound())

    def _release_write(self) -> bool:
        """A writer is the row's holder: the exclusive release (on PostgreSQL it hands the
        name over to a waiting ``lock()``'s reservation)."""
        if self.pg:
            statement, args = POSTGRESQL.release, [self.lock.key, self.owner, None]
        else:
            statement, args = SQLITE.release, [self.lock.key, self.owner]
        rows = self.backend.run(statement, args, "releasing a lock")
        return bool(rows and rows[0][0])

    def extend(self, ttl: float) -> Grant | None:
        if self.lock.kind == "write":
            dialect = POSTGRESQL if self.pg else SQLITE
            rows = self.backend.run(dialect.extend, [self._ttl(ttl), self.lock.key, self.owner],
                                    "extending a lock")
        else:
            params = {"key": self.lock.key, "owner": self.owner, "ttl": self._ttl(ttl)}

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
        until = self.lock.valid_until
        return None if until is None else max(time.monotonic(), until)
