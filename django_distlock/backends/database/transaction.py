"""Transaction mode: the lock is the row lock of the holder's open transaction.

``acquire()`` opens ``transaction.atomic()`` on the caller's connection and
takes the row lock (``UPDATE``, after ``SELECT ... FOR UPDATE NOWAIT`` when
not blocking); the lock is held until ``release()`` commits, or the ``with``
block rolls back on an exception. The critical section's writes commit or
roll back with the lock, and a crashed holder frees it at once. No TTL. On
SQLite, which has no row locks, the lock is the database's write lock: one
holder at a time for every name.
"""

from __future__ import annotations

import abc
import contextlib
import math
import sqlite3
import threading
from collections import OrderedDict
from typing import Any, ClassVar

from django.db import connections, transaction

from ...backoff import remaining
from ...exceptions import (
    BackendUnavailable,
    ConnectionInUse,
    Deadlock,
    LockLost,
    UnsupportedOperation,
)
from ...hold import Hold
from ...holders import current_holder
from ...kinds import Kind
from ..base import Acquisition, ExcInfo, Grant, LockInfo, LockPage, Miss
from .backend import DatabaseBackend, server_wait
from .errors import (
    ERRORS,
    is_busy,
    is_deadlock,
    is_duplicate,
    refused_wait,
    session_ended,
    transaction_refused,
)
from .mysql_sql import ENSURE_ROW as MYSQL_ENSURE_ROW
from .mysql_sql import TX_GRANT, TX_HELD, TX_IS_LOCKED, TX_NOWAIT, tx_wait
from .sql import (
    ENSURE_ROW,
    PG_TX_GRANT_WAITED,
    PG_TX_HELD,
    PG_TX_IS_LOCKED,
    PG_TX_NOWAIT,
    PG_TX_SETTLE,
    PG_TX_TIMEOUTS,
    POSTGRESQL,
    SQLITE,
    SQLITE_ENSURE_ROW,
    as_datetime,
    upper_bound,
)

#: How many names' rows a MySQL backend remembers having seen made (the least recently
#: used go first: such a name costs one plain read more at its next acquire).
KNOWN_ROWS = 4096
#: Longest an asyncio task's attempt waits in the server (see ``async_wait``).
_ASYNC_SLICE = 0.05
#: ``_slice``: the key is held on this connection by this owner's other handle.
_HELD = object()


class KnownKeys:
    """A bounded set of keys, the least recently used dropped first; any thread."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._mutex = threading.Lock()

    def has(self, key: str) -> bool:
        with self._mutex:
            if key not in self._keys:
                return False
            self._keys.move_to_end(key)
            return True

    def add(self, key: str) -> None:
        with self._mutex:
            self._keys[key] = None
            self._keys.move_to_end(key)
            while len(self._keys) > self.size:
                self._keys.popitem(last=False)


class _Stack(threading.local):
    """This thread's transaction-mode acquisitions, innermost last: their holds, and who
    took each (``holders.current_holder()``: the asyncio task or the thread)."""

    def __init__(self) -> None:
        self.holds: list[Hold] = []
        self.owners: list[object] = []


#: Why no force release, with an owner or without.
_HELD_BY_TRANSACTION = ("a transaction-mode lock is held by its holder's open transaction; "
                        "it ends when that transaction does")


class TransactionBackend(DatabaseBackend, mode="transaction"):
    """The database backend's transaction mode (``OPTIONS["MODE"] = "transaction"``)."""

    supports_listing = True
    why_unsupported = {
        "supports_force_release": _HELD_BY_TRANSACTION,
        "supports_force_release_by_owner": _HELD_BY_TRANSACTION,
        "supports_counting": "a transaction-mode lock is a row lock, seen only by trying it: "
        "a count would try the row of every name ever used, however few are held",
        "supports_waiters": "its waiters are transactions blocked in SELECT ... FOR UPDATE "
        "on the row, which PostgreSQL lists as waits on the holder's transaction (not "
        "stored with the lock), not in a queue of the name",
        "supports_leadership": "a term would be a transaction open for the leader's whole "
        "life, and a leader cut off from the server could not learn in time that the "
        "server rolled it back and granted the name to another (use MODE 'lease')",
    }

    #: Whether the name's row is locked. Params: key, key. Row: (held,).
    is_locked_statement: ClassVar[str] = PG_TX_IS_LOCKED
    #: One page of names, each marked free or not. Params (named): after, low, high,
    #: limit. Rows: the lock columns, then free.
    held_statement: ClassVar[str] = PG_TX_HELD

    @classmethod
    def for_vendor(cls, vendor: str) -> type[DatabaseBackend]:
        return {"sqlite": SqliteTransactionBackend, "mysql": MySqlTransactionBackend}.get(
            vendor, cls)

    def __init__(self, alias: str, params: Any) -> None:
        super().__init__(alias, params)
        self.stack = _Stack()

    def is_locked(self, name: str) -> bool:
        key = self.make_key(name)
        return bool(self.run(self.is_locked_statement, [key, key], "checking a lock")[0][0])

    def _held_locks(self, prefix: str, limit: int, cursor: str | None) -> LockPage:
        low = self.key_prefix + prefix
        params = {"after": cursor or "", "low": low, "high": upper_bound(low), "limit": limit}
        rows = self.run(self.held_statement, params, "listing locks")
        # The holder's own writes are not committed: only the name is known.
        infos = [
            LockInfo(self.alias, self.name_of(row[0]), "", None, None, None, "", None, "")
            for row in rows
            if not row[-1]
        ]
        return LockPage(infos, rows[-1][0] if len(rows) == limit else None)

    def check_fenced_write(self, hold: Hold, using: str) -> None:
        """Refuse, before any query, a fenced write of ``lock`` outside the transaction
        that holds it (see ``_TxAcquisition.check_fenced_write``)."""
        acquisition = hold.acquisition
        if isinstance(acquisition, _TxAcquisition):
            acquisition.check_fenced_write(using)

    def _sqlite_write_locked(self) -> bool:
        """Whether some connection holds the SQLite database's write lock."""
        path = connections[self.database].settings_dict["NAME"]
        try:
            probe = sqlite3.connect(str(path), timeout=0, isolation_level=None)
        except sqlite3.Error as exc:
            raise self.errors.translate(exc, f"opening {path!r}", self.where) from exc
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return True
            raise self.errors.translate(
                exc, f"probing the write lock of {path!r}", self.where) from exc
        finally:
            probe.close()


class MySqlTransactionBackend(TransactionBackend):
    """Transaction mode on MySQL and MariaDB (InnoDB): the lock is the row lock of
    ``SELECT ... FOR UPDATE``, the recipe of the textbook."""

    is_locked_statement = TX_IS_LOCKED
    held_statement = TX_HELD
    why_unsupported = {
        **TransactionBackend.why_unsupported,
        "supports_waiters": "its waiters are transactions blocked in SELECT ... FOR UPDATE "
        "on the row, which InnoDB lists as lock waits of the holder's transaction (not "
        "stored with the lock), not in a queue of the name",
    }

    def __init__(self, alias: str, params: Any) -> None:
        super().__init__(alias, params)
        #: Keys whose row this process saw made (``MySqlTxAcquisition._row_first``).
        self.known_rows = KnownKeys(KNOWN_ROWS)


class SqliteTransactionBackend(TransactionBackend):
    """Transaction mode on SQLite: the lock is the database's write lock."""

    supports_listing = False
    why_unsupported = {
        **TransactionBackend.why_unsupported,
        "supports_waiters": "its waiters retry SQLite's write lock in their own processes; "
        "SQLite keeps no queue of them",
        "supports_listing": "its locks are the SQLite database's write lock, which has "
        "no names to list",
        "supports_counting": "its locks are the SQLite database's write lock, which has "
        "no names to count",
    }

    def is_locked(self, name: str) -> bool:
        self.make_key(name)  # validates the name
        return self._sqlite_write_locked()


class _TxAcquisition(Acquisition):
    """An open ``atomic()`` block on this thread's connection, from grant to release."""

    backend: TransactionBackend

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.atomic: transaction.Atomic | None = None
        self.thread = 0  # the thread whose connection holds the transaction
        self.raw: Any = None  # the driver's connection that holds it
        #: Who acquires: the asyncio task (seen from its loop) or the thread.
        self.owner: object | None = None

    @property
    def connection(self) -> Any:
        return connections[self.backend.database]

    def attempt(self) -> Grant | Miss:
        if self.owner is None:
            self.owner = current_holder()
        if self._held_here():
            return Miss()
        if self.blocking:
            return Miss()  # the wait takes the lock, bounded by the deadline
        return self._take(None) or Miss()

    def wait(self, miss: Miss) -> Grant | None:
        if self._held_here():
            return super().wait(miss)
        return self._take(server_wait(self.deadline))

    def _held_here(self) -> bool:
        """Whether this owner holds the key on this thread's connection through another
        handle (the row lock would let us in; we don't). Runs in the connection's thread,
        before any SQL.

        :raises ConnectionInUse: the connection's transaction holds a lock of someone
            else: another asyncio task of the loop whose sync calls run in this thread.
            Its row lock would let us in, and our block would be a savepoint of its
            transaction (committed, or rolled back, with its lock, not ours). A blocking
            task waits for it instead (``aattempt``, ``async_wait``); sync code in
            this thread must not (the holder's release needs the thread).
        """
        stack = self.backend.stack
        pairs = zip(stack.holds, stack.owners, strict=True)
        others = [hold.key for hold, owner in pairs if owner != self.owner]
        if others:
            names = ", ".join(repr(self.backend.name_of(key)) for key in others)
            raise ConnectionInUse(
                f"{self.hold!r}: this thread's connection to {self.backend.database!r} is "
                f"in the transaction of another task's transaction-mode lock ({names}); "
                "asyncio tasks of one event loop share that connection, so one of them at "
                "a time may hold transaction-mode locks (a blocking acquire of a task waits "
                "for it). Nothing was sent. Retry after it is released, or use lease mode "
                "for locks that tasks hold concurrently."
            )
        key = self.hold.key
        for hold in stack.holds:  # noqa: SIM110 (any() would add two calls: hops budget)
            if hold.key == key:
                return True
        return False

    async def aattempt(self) -> Grant | Miss:
        self.owner = current_holder()  # the task, seen from its loop
        try:
            # A grant that comes after the task was cancelled is an atomic block left
            # open on the thread's connection: abandonable() closes it in that thread.
            return await self.abandonable(self.attempt, Miss())
        except ConnectionInUse:
            if not self.blocking:
                raise
            return Miss()  # wait, in the loop, for the other task to release

    async def async_wait(self, miss: Miss) -> Grant | None:
        """Tasks of one event loop share one thread's connection (``sync_to_async``): a
        wait there would hold up the other tasks, so take the lock in short slices; while
        another task holds locks on the connection, back off in the loop (within the
        timeout, as for a held lock)."""
        wait = server_wait(self.deadline)
        try:
            grant = await self.abandonable(lambda: self._slice(min(wait, _ASYNC_SLICE)), None)
        except ConnectionInUse:
            grant = _HELD
        if grant is not _HELD and (grant is not None or wait <= _ASYNC_SLICE):
            return grant if isinstance(grant, Grant) else None
        return await super().async_wait(miss)

    def _slice(self, wait: float) -> Grant | object | None:
        """One slice of an asyncio task's wait, in the connection's thread."""
        return _HELD if self._held_here() else self._take(wait)

    @abc.abstractmethod
    def _take(self, wait: float | None) -> Grant | None:
        """Open the atomic block and take the row lock (waiting ``wait`` s; None: not)."""

    @staticmethod
    def _abort(atomic: transaction.Atomic, exc: BaseException) -> None:
        """Roll the block back after ``exc`` (a client error); raise it again unless it
        means "held elsewhere" (``_take`` translates it, or the rollback's own error)."""
        atomic.__exit__(type(exc), exc, exc.__traceback__)
        if not is_busy(exc):
            raise exc

    def _granted(self, atomic: transaction.Atomic, fencing: int, acquired_at: Any) -> Grant:
        self.atomic = atomic
        self.thread = threading.get_ident()
        self.raw = self.connection.connection
        self.backend.stack.holds.append(self.hold)
        self.backend.stack.owners.append(self.owner or current_holder())
        return Grant(fencing, as_datetime(acquired_at), None)

    def check_fenced_write(self, using: str) -> None:
        """A fenced write of this lock must be part of the transaction that holds it: on
        its database, by its thread, while its block is open on the same connection.
        Then a write made after the holder's session died cannot commit (it fails with
        the session, or is rolled back with the lock), whatever its token.

        :raises UnsupportedOperation: the write is elsewhere.
        :raises LockLost: the holding connection is closed or was replaced.
        """
        if using != self.backend.database or self.thread != threading.get_ident():
            raise UnsupportedOperation(
                f"{self.hold!r}: a transaction-mode lock fences only the writes of its own "
                f"transaction: on database {self.backend.database!r}, by the thread that "
                f"acquired it, inside its block (this write: database {using!r}"
                f"{'' if self.thread == threading.get_ident() else ', another thread'})."
            )
        connection = self.connection
        raw = connection.connection
        if (self.atomic is None or raw is None or raw is not self.raw
                or not connection.in_atomic_block or getattr(raw, "closed", False)):
            self.hold.mark_lost()
            raise LockLost(
                f"{self.hold!r}: the transaction that held the lock is gone (its connection "
                "was closed or replaced); a fenced write with it is refused."
            )

    def _check_thread(self, doing: str) -> transaction.Atomic:
        if self.atomic is None:
            raise UnsupportedOperation(f"{self.hold!r} has no open transaction.")
        if self.thread != threading.get_ident():
            raise UnsupportedOperation(
                f"A transaction-mode lock is its thread's open transaction; it must be {doing} "
                "by the thread that acquired it."
            )
        return self.atomic

    def release(self, exc_info: ExcInfo) -> bool:
        atomic = self._check_thread("released")
        stack = self.backend.stack
        if stack.holds[-1].key != self.hold.key:
            raise UnsupportedOperation(
                "Transaction-mode locks are nested atomic blocks: release them in the "
                f"reverse order of acquisition ({stack.holds[-1].key!r} first)."
            )
        stack.holds.pop()
        stack.owners.pop()
        self.atomic = None
        try:
            atomic.__exit__(*exc_info)  # commit, or roll back on an exception
        except ERRORS as exc:
            if session_ended(exc):
                raise LockLost(
                    f"{self.hold!r}: the database session holding the lock ended; its "
                    f"transaction did not commit: {exc}"
                ) from exc
            raise self.backend.errors.translate(
                exc, "committing the lock's transaction", self.backend.where) from exc
        return True

    def extend(self, ttl: float) -> Grant | None:
        """No expiry to move: check that the session holding the lock is still there."""
        self._check_thread("extended")
        try:
            with self.connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except ERRORS as exc:
            if session_ended(exc):
                raise LockLost(
                    f"{self.hold!r}: the database session holding the lock ended: {exc}"
                ) from exc
            raise self.backend.errors.translate(
                exc, "checking the lock's session", self.backend.where) from exc
        return Grant(self.hold.fencing_token, self.hold.acquired_at, None)


class _RowTxAcquisition(_TxAcquisition):
    """Transaction mode where the lock is the name's row lock (PostgreSQL, MySQL): a
    name's first use makes its row, committed apart from the caller's transaction."""

    #: Make the name's row unless it exists. Params: key (repeated as the statement
    #: needs).
    ensure_row: str = ENSURE_ROW
    ensure_row_params = 1
    #: Whether ``_row_first`` runs before the locking read (PostgreSQL: a locking read of
    #: a missing row locks nothing, so it makes the row only after a miss of it).
    makes_row_first = False

    @abc.abstractmethod
    def _lock_and_grant(self, cursor: Any, wait: float | None) -> tuple[int, Any] | None:
        """In the open block: take the row lock (waiting at most ``wait`` s; None: not)
        and stamp the grant; (fencing, acquired_at), or None if the name has no row."""

    def _take(self, wait: float | None) -> Grant | None:
        if self.makes_row_first and not self._row_first():
            return None
        while True:
            try:
                atomic = transaction.atomic(using=self.backend.database)
                atomic.__enter__()
                try:
                    with self.connection.cursor() as cursor:
                        row = self._lock_and_grant(cursor, wait)
                except ERRORS as exc:
                    self._abort(atomic, exc)
                    return None
                if row is None:
                    atomic.__exit__(None, None, None)
            except ERRORS as exc:
                if is_deadlock(exc):
                    raise self._refused(exc) from exc
                raise self.backend.errors.translate(
                    exc, "acquiring a lock", self.backend.where) from exc
            if row is not None:
                return self._granted(atomic, *row)
            # First use of the name: commit its row where everyone sees it, then lock it.
            if not self._create_row():
                return None
            left = remaining(self.deadline)
            if wait is not None:
                wait = max(min(wait, left if left is not None else wait), 0.001)

    def _refused(self, exc: BaseException) -> Deadlock:
        """The wait for the row closed a cycle of waits, and the server refused it. On
        PostgreSQL it rolled back to the wait's savepoint only: this thread's outer locks
        stay held. InnoDB rolled this connection's whole transaction back (its row locks
        with it): the outer locks are gone, so their holds are marked lost now (their
        releases raise ``LockLost``; Django refuses queries in their blocks until then),
        before the other waits of the cycle are granted them."""
        if self.backend.vendor == "mysql":
            for hold in list(self.backend.stack.holds):
                hold.mark_lost()
        return refused_wait(self.backend.where, self.hold.name, self.backend.alias, exc)

    def _row_first(self) -> bool:
        """Before the locking read: make the name's row if it may not exist yet (False: a
        miss)."""
        return True

    def _create_row(self) -> bool:
        """Create the name's row (committed, apart from the caller's transaction);
        False if another creator held it up past the row-lock wait (a miss)."""
        params = [self.hold.key] * self.ensure_row_params
        try:
            self.backend.run(self.ensure_row, params, "creating a lock row", fetch=False)
        except BackendUnavailable as exc:
            cause = exc.__cause__
            if cause is not None and is_duplicate(cause):
                return True  # a creator that raced us made it
            if cause is not None and self.backend.vendor == "mysql" and transaction_refused(
                    cause):
                # InnoDB: two creators of a name whose row a prune deleted (and the purge
                # has not yet removed) each take a shared lock of the deleted record, then
                # both want it exclusive: one is chosen (1213), the other makes the row.
                return True
            if cause is not None and is_busy(cause):
                return False
            raise
        return True


class PgTxAcquisition(_RowTxAcquisition):
    def _lock_and_grant(self, cursor: Any, wait: float | None) -> tuple[int, Any] | None:
        if wait is None:
            cursor.execute(PG_TX_NOWAIT, [self.hold.key])
            # The UPDATE keeps the row lock NOWAIT took.
            return self._grant_row(cursor) if cursor.fetchone() else None
        return self._grant_waited(cursor, wait)

    def _grant_row(self, cursor: Any) -> tuple[int, Any] | None:
        hold = self.hold
        cursor.execute(POSTGRESQL.tx_grant, [hold.host, hold.pid, hold.holder_field, hold.key])
        row: tuple[int, Any] | None = cursor.fetchone()
        return row

    def _grant_waited(self, cursor: Any, wait: float) -> tuple[int, Any] | None:
        """Take the row lock waiting at most ``wait`` s: three statements, in one round
        trip through psycopg 3's pipeline (in three on psycopg2). The first sets the bounds
        (a statement's timer is armed when it begins), the grant's puts them back, the
        third takes a cancel that the grant's statement timer may have left pending
        (``PG_TX_SETTLE``). The first error stops the rest; the rollback of the block then
        restores the bounds (a savepoint's too)."""
        hold = self.hold
        limit = f"{max(1, math.ceil(wait * 1000))}ms"
        raw = cursor.db.connection  # the driver's (the property would add a call)
        batch = raw.pipeline() if hasattr(raw, "pipeline") else contextlib.nullcontext()
        with raw.cursor() as own, batch:  # ``own``: the two statements whose rows go unread
            own.execute(PG_TX_TIMEOUTS, [limit, limit])
            cursor.execute(PG_TX_GRANT_WAITED, [hold.host, hold.pid, hold.holder_field, hold.key])
            own.execute(PG_TX_SETTLE)
        fencing, acquired_at = cursor.fetchone()[:2]
        return None if fencing is None else (fencing, acquired_at)


class MySqlTxAcquisition(_RowTxAcquisition):
    """The row lock by ``SELECT ... FOR UPDATE`` (``NOWAIT``, or bounded for this
    statement only), then the grant's procedure: two round trips in the block."""

    ensure_row = MYSQL_ENSURE_ROW
    ensure_row_params = 2
    makes_row_first = True
    backend: MySqlTransactionBackend

    def _row_first(self) -> bool:
        """Make the row of a name this process has not seen a row of, first: under
        REPEATABLE READ a locking read of a missing row takes a gap lock, which an outer
        ``atomic()`` block of the caller keeps, and the row could not be made until it
        ends. One plain read on the backend's connection, once per name and process."""
        known = self.backend.known_rows
        if known.has(self.hold.key):
            return True
        if not self._create_row():
            return False
        known.add(self.hold.key)
        return True

    def _lock_and_grant(self, cursor: Any, wait: float | None) -> tuple[int, Any] | None:
        hold = self.hold
        statement = TX_NOWAIT if wait is None else tx_wait(wait, self.connection.mysql_is_mariadb)
        cursor.execute(statement, [hold.key])
        if cursor.fetchone() is None:
            return None
        cursor.execute(TX_GRANT, [hold.key, hold.host, hold.pid, hold.holder_field])
        row = cursor.fetchone()
        return None if row is None else (row[0], row[1])


class SqliteTxAcquisition(_TxAcquisition):
    def _take(self, wait: float | None) -> Grant | None:
        busy_ms = 0 if wait is None else min(math.ceil(wait * 1000), 2**31 - 1)
        hold = self.hold
        try:
            with self.connection.cursor() as cursor:
                cursor.execute("PRAGMA busy_timeout")
                previous = cursor.fetchone()[0]
                cursor.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
                try:
                    atomic = transaction.atomic(using=self.backend.database)
                    try:
                        atomic.__enter__()
                    except ERRORS as exc:
                        if is_busy(exc):
                            return None
                        raise
                    try:
                        params = [hold.host, hold.pid, hold.holder_field, hold.key]
                        cursor.execute(SQLITE.tx_grant, params)
                        row = cursor.fetchone()
                        if row is None:  # first use of the name; the write lock is ours
                            cursor.execute(SQLITE_ENSURE_ROW, [hold.key])
                            cursor.execute(SQLITE.tx_grant, params)
                            row = cursor.fetchone()
                    except ERRORS as exc:
                        self._abort(atomic, exc)
                        return None
                finally:
                    cursor.execute(f"PRAGMA busy_timeout = {int(previous)}")
        except ERRORS as exc:
            raise self.backend.errors.translate(
                exc, "acquiring a lock", self.backend.where) from exc
        return self._granted(atomic, *row)


# Set here, below the acquisition classes (the backends come first in this module).
TransactionBackend.kinds = {Kind.EXCLUSIVE: PgTxAcquisition}
MySqlTransactionBackend.kinds = {Kind.EXCLUSIVE: MySqlTxAcquisition}
SqliteTransactionBackend.kinds = {Kind.EXCLUSIVE: SqliteTxAcquisition}
