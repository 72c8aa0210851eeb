"""Lease mode's read-write locks and semaphores (``read_lock``, ``write_lock``,
``semaphore``), on PostgreSQL and SQLite (MySQL's are its lease procedures, every kind
in one: sql/mysql.sql; this module lists their shares).

A reader or a permit is a row of ``django_distlock_share`` with its own expiry; a
writer holds the name's row as an exclusive holder does, so ``lock(name)`` and
``write_lock(name)`` exclude each other and share one fencing counter. Every grant,
release and extend locks the name's row first (``shares_sql.py`` says why that makes
the count of live shares exact): on PostgreSQL in one call of a function of migration
0009, on SQLite in one short transaction of a few statements.

On PostgreSQL, waiting threads queue in the server on an advisory lock of the name
(not the exclusive lock's queue); the head listens on the name's channel, and the
release that frees the name (a share's, a writer's or an exclusive holder's) notifies
it, so it attempts again at once (:mod:`.share_acquisition`). On SQLite, and for asyncio
tasks, waiters poll with backoff and jitter. A waiting writer marks the row, and the
mark keeps new readers out until it is granted, gives up, or stops renewing it
(docs/database.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections, transaction

from ..base import Freed
from .errors import ERRORS, connection_lost, did_not_answer, is_busy
from .sessions import Session, watched
from .shares_sql import (
    MYSQL_LISTED,
    PERMITS,
    PG_FORCE,
    PG_LISTED,
    READERS,
    SHARES_LISTED,
    SQLITE_SHARES,
    WRITER_SUFFIX,
)

if TYPE_CHECKING:
    from .lease import LeaseBackend

T = TypeVar("T")
#: Runs one statement of a transaction and returns its rows.
Run = Callable[[str, dict[str, Any]], list[Any]]


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
        with backend.errors.translating(doing, backend.where), \
                transaction.atomic(using=backend.database), \
                connections[backend.database].cursor() as cursor:
            def run(statement: str, params: dict[str, Any]) -> list[Any]:
                cursor.execute(statement, params)
                return cursor.fetchall() if cursor.description else []

            return steps(run)
    return _on_pg(backend, doing, lambda session: _on_session(session, steps, deadline))


def pg_call(backend: LeaseBackend, doing: str, statement: str, params: dict[str, Any],
            deadline: float | None = None) -> list[Any]:
    """PostgreSQL: run one statement (a call of a share function, its own transaction) on
    this thread's session, once more on a new one if its connection was lost.

    :param deadline: when the watchdog cuts a server that does not answer (monotonic,
        plus its grace; None: never).
    :returns: its rows.
    :raises BackendUnavailable: when the database fails (its error chained).
    """
    def call(session: Session) -> list[Any]:
        with session.mutex, watched(session, deadline):
            found = session.execute(statement, params)
            return found.fetchall() if found.description else []

    return _on_pg(backend, doing, call)


def _on_pg(backend: LeaseBackend, doing: str, call: Callable[[Session], T]) -> T:
    """Run ``call`` on this thread's session; on a lost connection, once more."""
    for last in (False, True):
        session: Session | None = None
        try:
            session = backend.sessions.get()
            return call(session)
        except ERRORS as exc:
            if is_busy(exc) and not (session and session.timed_out):
                # rolled back; the session is usable
                raise backend.errors.translate(exc, doing, backend.where) from exc
            backend.sessions.forget()
            if session is not None and session.timed_out:
                raise did_not_answer(backend.where) from exc
            if last or not connection_lost(exc):
                raise backend.errors.translate(exc, doing, backend.where) from exc
            # The session was gone (terminated, the server restarted): once more.
    raise AssertionError("unreachable")


def _on_session(session: Session, steps: Callable[[Run], T], deadline: float | None) -> T:
    """Run ``steps`` between ``BEGIN`` and ``COMMIT`` on ``session`` (rolled back if it
    raises), watched until ``deadline``."""
    cursor = session.cursor

    def run(statement: str, params: dict[str, Any]) -> list[Any]:
        found = session.execute(statement, params)
        return found.fetchall() if found.description else []

    with session.mutex, watched(session, deadline):
        cursor.execute("BEGIN", prepare=False)
        try:
            result = steps(run)
            cursor.execute("COMMIT", prepare=False)
        except BaseException:
            with contextlib.suppress(*ERRORS):
                cursor.execute("ROLLBACK", prepare=False)
            raise
        return result


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
    """The live shares of the names ``keys``, every holder (at most
    :data:`~.shares_sql.SHARES_LISTED` per name), in grant order.

    :param backend: the lease backend.
    :param keys: storage keys whose rows show readers or permits.
    :returns: rows (name, owner, fencing, acquired_at, expires_at, host, pid, thread,
        kind).
    :raises BackendUnavailable: when the database fails.
    """
    names = ", ".join(f"%(n{index})s" for index in range(len(keys)))
    listed = {"postgresql": PG_LISTED, "mysql": MYSQL_LISTED}.get(
        backend.vendor, SQLITE_SHARES.listed)
    statement = listed.format(names=names)
    params: dict[str, Any] = {f"n{index}": key for index, key in enumerate(keys)}
    params["most"] = SHARES_LISTED
    return backend.run(statement, params, "listing locks")


def with_shares(backend: LeaseBackend, rows: list[Any]) -> list[Any]:
    """A listing page's rows with each name held by readers or permits replaced by one
    row per live share (a name whose shares all ended meanwhile keeps its row).

    :param backend: the lease backend.
    :param rows: the page's rows of ``django_distlock_lock`` (name first, owner second).
    :returns: the rows to show, in the page's order.
    :raises BackendUnavailable: when the database fails.
    """
    shared = [row[0] for row in rows if row[1] in (READERS, PERMITS)]
    if not shared:
        return rows
    holders: dict[str, list[Any]] = {}
    for share in listed_shares(backend, shared):
        holders.setdefault(share[0], []).append(share)
    return [share for row in rows for share in holders.get(row[0], [row])]


def force_release(backend: LeaseBackend, key: str, owner: str) -> Freed | None:
    """Free the name ``key``: its holder, or its readers or permits.

    :param backend: the lease backend.
    :param key: the storage key.
    :param owner: free only the holder or share whose short owner id this is ("": all).
    :returns: :class:`Freed`, or None when nothing held was freed.
    :raises BackendUnavailable: when the database fails.
    """
    if backend.vendor == "postgresql":
        # One call; it wakes the head of the name's queue.
        rows = pg_call(backend, "force-releasing a lock", PG_FORCE,
                       {"key": key, "expected": owner})
        return Freed() if rows and rows[0][0] else None
    sql = SQLITE_SHARES
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
