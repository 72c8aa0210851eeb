"""The database backend: a lock row per key, on PostgreSQL or SQLite.

Two modes, chosen with ``OPTIONS["MODE"]``:

``"lease"`` (default)
    The row records the owner and an expiry from the database's clock. Each
    operation is one autocommit statement; on PostgreSQL they run on a
    connection of their own (one per thread), so a lease never joins, and is
    never rolled back with, the caller's transaction. Waiters are woken by
    LISTEN/NOTIFY on PostgreSQL, and back off with jitter on SQLite.

``"transaction"``
    ``acquire()`` opens ``transaction.atomic()`` on the caller's connection
    and takes the row lock (``SELECT ... FOR UPDATE``, ``NOWAIT`` when not
    blocking); the lock is held until ``release()`` commits, or the ``with``
    block rolls back on an exception. The critical section's writes commit
    or roll back with the lock, and a crashed holder frees it at once. No
    TTL. On SQLite, which has no row locks, the lock is the database's write
    lock: one holder at a time for every name.
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import DatabaseError, Error, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..exceptions import BackendUnavailable, InvalidBackendOptions, UnsupportedOperation
from ..names import validate_name
from . import _dbsql as sql
from ._pglisten import Listener, QueueWaiter
from .base import BaseLockBackend, Grant, LockInfo, LockPage, Miss, Waiter, validate_page_args

if TYPE_CHECKING:
    from ..lease import Lock

MODES = ("lease", "transaction")
_OPTION_KEYS = frozenset({"DATABASE", "MODE", "PREPARE"})
#: Longest a lease statement waits for a row lock held by someone else's
#: transaction before the attempt counts as a miss (lease rows are locked
#: only for the duration of one statement).
_ROW_LOCK_WAIT = "200ms"


@dataclass
class _TxState:
    """A transaction-mode acquisition: its open atomic block and its thread."""

    atomic: transaction.Atomic
    thread: int
    grant: Grant


#: ``Lock.backend_state`` of a lease-mode acquisition past its first attempt.
_WAITING = "waiting"


class _TxStack(threading.local):
    """This thread's transaction-mode acquisitions, innermost last."""

    def __init__(self) -> None:
        self.keys: list[str] = []


class _LeaseCursors(threading.local):
    wrapper: BaseDatabaseWrapper | None = None
    cursor: Any = None
    pid: int = 0
    #: psycopg's ``prepare`` argument (the backend's ``OPTIONS["PREPARE"]``).
    prepare: bool = True
    #: The cursor whose session heads a waiter queue (see ``_enqueue``), for which key,
    #: and whether a release was notified since it became the head.
    queued: Any = None
    queued_key: str | None = None
    notified: bool = False


class DatabaseBackend(BaseLockBackend):
    """Locks as rows of ``django_distlock_lock``; see the module docstring.

    ``OPTIONS``: ``DATABASE`` (alias in ``DATABASES``, default ``"default"``),
    ``MODE`` (``"lease"`` or ``"transaction"``), ``PREPARE`` (PostgreSQL lease
    statements as prepared statements, default True; False behind a pooler
    that cannot keep them).
    """

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = set(self.options) - _OPTION_KEYS
        if unknown:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS'] has unknown keys {sorted(unknown)}; "
                f"the database backend takes {sorted(_OPTION_KEYS)}."
            )
        self.database: str = self.options.get("DATABASE", "default")
        self.mode: str = self.options.get("MODE", "lease")
        if not isinstance(self.database, str):
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['DATABASE'] must be a str."
            )
        if self.mode not in MODES:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['MODE'] must be one of {MODES}, got {self.mode!r}."
            )
        self.prepare = self.options.get("PREPARE", True)
        if not isinstance(self.prepare, bool):
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['PREPARE'] must be True or False."
            )
        self.transactional = self.mode == "transaction"
        if self.transactional:
            self.supports_expiry = False
            self.supports_force_release = False
        self._local = _LeaseCursors()
        self._tx_stack = _TxStack()
        self._mutex = threading.Lock()
        # Weak: a finished thread's lease connection is closed when collected.
        self._wrappers: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()
        self._listener: Listener | None = None

    # -- setup --------------------------------------------------------------

    @cached_property
    def vendor(self) -> str:
        """The database vendor: ``"postgresql"`` or ``"sqlite"``."""
        return connections[self.database].vendor

    @cached_property
    def dialect(self) -> sql.Dialect:
        if self.vendor == "postgresql":
            return sql.POSTGRESQL
        if self.vendor == "sqlite":
            return sql.SQLITE
        raise UnsupportedOperation(
            f"The database backend serves PostgreSQL and SQLite, not {self.vendor!r} "
            f"(DATABASES[{self.database!r}])."
        )

    @property
    def supports_listing(self) -> bool:  # type: ignore[override]
        return not (self.transactional and self.vendor == "sqlite")

    @cached_property
    def _notifies(self) -> bool:
        """Whether the driver can wait for notifications (see ``_is_psycopg3``)."""
        return _is_psycopg3(self.database)

    @property
    def wakes_waiters(self) -> bool:  # type: ignore[override]
        return self.vendor == "postgresql"

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from ..checks import database_checks

        return database_checks(self)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._mutex:
            wrappers, self._wrappers = list(self._wrappers), weakref.WeakSet()
        for wrapper in wrappers:
            if getattr(wrapper, "_distlock_pid", None) == os.getpid():
                with contextlib.suppress(Error):
                    wrapper.close()
        self._local = _LeaseCursors()

    # -- connections ----------------------------------------------------------

    def _cursor(self) -> Any:
        """The cursor lease statements run on.

        On PostgreSQL: a psycopg cursor with server-side binding on this
        thread's own autocommit connection, so that the lease statements are
        prepared once per connection (set the backend's ``OPTIONS["PREPARE"]``
        to False behind a pooler that cannot keep prepared statements, such
        as PgBouncer's transaction pooling before 1.21). Elsewhere: the
        Django connection's cursor.
        """
        if self.vendor != "postgresql":
            return connections[self.database].cursor()
        local = self._local
        if local.cursor is None or local.pid != os.getpid():
            local.cursor = None
            wrapper = self._new_wrapper()
            raw = wrapper.connection
            if self.prepare and hasattr(raw, "prepare_threshold"):
                # Django turns preparing off for every connection; this one is ours.
                raw.prepare_threshold = 0
            cursor = _pg_cursor(raw)
            cursor.execute(sql.PG_LOCK_TIMEOUT_SESSION, [_ROW_LOCK_WAIT])
            local.prepare = self.prepare
            local.wrapper, local.cursor, local.pid = wrapper, cursor, os.getpid()
        return local.cursor

    def _execute(self, cursor: Any, statement: str, params: list[Any]) -> None:
        """Execute on a cursor of :meth:`_cursor`, prepared where that is allowed."""
        if self.vendor == "postgresql":
            cursor.execute(statement, params, prepare=self._local.prepare)
        else:
            cursor.execute(statement, params)

    def _new_wrapper(self) -> BaseDatabaseWrapper:
        wrapper = connections.create_connection(self.database)
        wrapper.inc_thread_sharing()  # close() may run on another thread
        wrapper._distlock_pid = os.getpid()  # type: ignore[attr-defined]
        wrapper.ensure_connection()
        with self._mutex:
            self._wrappers.add(wrapper)
        return wrapper

    def _forget_cursor(self) -> None:
        local = self._local
        wrapper, local.wrapper, local.cursor = local.wrapper, None, None
        if wrapper is not None:
            with contextlib.suppress(Error):
                wrapper.close()

    def _unavailable(self, exc: BaseException, doing: str) -> BackendUnavailable:
        self._forget_cursor()
        return BackendUnavailable(
            f"Database {self.database!r} failed while {doing} (lock alias {self.alias!r}): {exc}"
        )

    def _run(
        self, statement: str, params: list[Any], doing: str, fetch: bool = True
    ) -> list[tuple[Any, ...]]:
        """Run one lease statement and return its rows; map failures to BackendUnavailable."""
        try:
            cursor = self._cursor()
            self._execute(cursor, statement, params)
            return cursor.fetchall() if fetch else []
        except _ERRORS as exc:
            raise self._unavailable(exc, doing) from exc

    def _ttl(self, seconds: float) -> object:
        return sql.sqlite_ttl(seconds) if self.vendor == "sqlite" else seconds

    # -- lease mode -------------------------------------------------------------

    def try_acquire(self, lock: Lock, token: str, wait: float | None) -> Grant | Miss:
        if self.transactional:
            return self._tx_acquire(lock, wait)
        if self.vendor == "postgresql":
            params = sql.pg_acquire_params(
                lock.key,
                token,
                lock.ttl,
                lock.host,
                lock.pid,
                lock.thread,
                retry=lock.backend_state is _WAITING,
            )
        else:
            params = [lock.key, token, self._ttl(lock.ttl), lock.host, lock.pid, lock.thread]
        try:
            cursor = self._cursor()
            if self._local.notified and self._heads(lock.key):
                row = self._attempt_and_dequeue(cursor, lock.key, params)
            else:
                self._execute(cursor, self.dialect.acquire, params)
                row = cursor.fetchone()
            if row is None and self.dialect.retry_after is not None:
                # SQLite only: the miss path's second statement (local, cheap).
                cursor.execute(self.dialect.retry_after, [lock.key])
                found = cursor.fetchone()
                return Miss(found[0] if found else None)
        except _ERRORS as exc:
            if _is_busy(exc):
                return Miss()
            raise self._unavailable(exc, "acquiring a lock") from exc
        if row is None:
            return Miss()
        granted, fencing, acquired_at, expires_at, retry_after = row
        if not granted:
            return Miss(retry_after)
        return Grant(fencing, sql.as_datetime(acquired_at), sql.as_datetime(expires_at))

    def release_lock(self, lock: Lock, token: str, exc_info: tuple[Any, Any, Any]) -> bool:
        if self.transactional:
            state = self._tx_state(lock, "released")
            stack = self._tx_stack.keys
            if stack[-1] != lock.key:
                raise UnsupportedOperation(
                    "Transaction-mode locks are nested atomic blocks: release them in the "
                    f"reverse order of acquisition ({stack[-1]!r} first)."
                )
            stack.pop()
            state.atomic.__exit__(*exc_info)  # commit, or roll back on an exception
            return True
        params = [lock.key, token]
        if self.vendor == "postgresql":
            params += [lock.key, sql.queue_channel(lock.key)]
        rows = self._run(self.dialect.release, params, "releasing a lock")
        return bool(rows and rows[0][0])

    def extend_lock(self, lock: Lock, token: str, ttl: float) -> Grant | None:
        if self.transactional:
            return self._tx_state(lock, "extended").grant
        rows = self._run(
            self.dialect.extend, [self._ttl(ttl), lock.key, token], "extending a lock"
        )
        if not rows:
            return None
        fencing, acquired_at, expires_at = rows[0]
        return Grant(fencing, sql.as_datetime(acquired_at), sql.as_datetime(expires_at))

    def waiter(self, lock: Lock) -> Waiter:
        if self.transactional or not self.wakes_waiters or not self._notifies:
            return Waiter()
        if self._listener is None:
            with self._mutex:
                if self._listener is None:
                    self._listener = Listener(self._listen_connection)
        lock.backend_state = _WAITING  # later attempts are retries (see _dbsql.POSTGRESQL)

        def done(key: str) -> None:
            lock.backend_state = None
            if self._heads(key):
                self._dequeue(key)

        return QueueWaiter(
            lock.key,
            enqueue=self._enqueue,
            heads=self._heads,
            wait_released=self._wait_released,
            done=done,
            listener=self._listener,
        )

    def _heads(self, key: str) -> bool:
        """Whether this thread's lease connection heads the waiter queue of ``key``."""
        local = self._local
        return local.queued is not None and local.queued is local.cursor and local.queued_key == key

    def _enqueue(self, key: str, wait: float | None) -> None:
        """Wait up to ``wait`` seconds to head the waiter queue of ``key`` (see ``_heads``).

        The head listens for the key's release on its own lease connection.
        """
        wait_ms = 0 if wait is None else max(1, math.ceil(wait * 1000))
        try:
            cursor = self._cursor()
            cursor.execute(sql.pg_enqueue(key, wait_ms), prepare=False)
        except _ERRORS as exc:
            if _is_busy(exc):  # waited ``wait`` seconds; the caller's deadline has passed
                self._run(sql.PG_LOCK_TIMEOUT_SESSION, [_ROW_LOCK_WAIT], "leaving a lock's queue")
                return
            raise self._unavailable(exc, "waiting for a lock") from exc
        self._local.queued, self._local.queued_key, self._local.notified = cursor, key, False

    def _wait_released(self, seconds: float) -> None:
        """As the head of a queue: sleep until a release is notified, or ``seconds`` pass."""
        try:
            for _ in self._local.queued.connection.notifies(timeout=seconds, stop_after=1):
                self._local.notified = True
        except _ERRORS as exc:
            raise self._unavailable(exc, "waiting for a lock") from exc

    def _attempt_and_dequeue(self, cursor: Any, key: str, params: list[Any]) -> Any:
        """The head's attempt after a notified release, and its leaving the queue, pipelined.

        The attempt most likely succeeds; if it does not (an asyncio waiter
        got in first), this waiter queues again. Returns the attempt's row.
        """
        raw = cursor.connection
        side = _pg_cursor(raw)
        with raw.pipeline():
            self._execute(cursor, self.dialect.acquire, params)
            side.execute(f"UNLISTEN {sql.queue_channel(key)}", prepare=False)
            side.execute(sql.PG_DEQUEUE, [sql.queue_key(key), _ROW_LOCK_WAIT], prepare=False)
        self._local.queued = None
        return cursor.fetchone()

    def _dequeue(self, key: str) -> None:
        """Leave the head of ``key``'s queue: the next waiter heads it."""
        queued, self._local.queued = self._local.queued, None
        try:
            queued.execute(sql.pg_dequeue(key, _ROW_LOCK_WAIT), prepare=False)
        except _ERRORS as exc:
            raise self._unavailable(exc, "leaving a lock's queue") from exc

    def _listen_connection(self) -> tuple[Any, Any]:
        wrapper = self._new_wrapper()
        raw = wrapper.connection
        raw.autocommit = True
        return wrapper.close, raw

    def is_locked(self, name: str) -> bool:
        key = self.make_key(name)
        if not self.transactional:
            return bool(self._run(self.dialect.is_locked, [key], "checking a lock"))
        if self.vendor == "postgresql":
            return bool(self._run(sql.PG_TX_IS_LOCKED, [key, key], "checking a lock")[0][0])
        return self._sqlite_write_locked()

    def held_locks(
        self, prefix: str = "", limit: int = 50, cursor: str | None = None
    ) -> LockPage:
        prefix, limit, cursor = validate_page_args(prefix, limit, cursor)
        if prefix:
            validate_name(prefix)
        if not self.supports_listing:
            raise UnsupportedOperation(
                "Transaction-mode locks on SQLite are the database's write lock; "
                "they cannot be listed by name."
            )
        low = self.key_prefix + prefix
        params = [cursor or "", low, sql.upper_bound(low), limit]
        statement = sql.PG_TX_HELD if self.transactional else self.dialect.held
        rows = self._run(statement, params, "listing locks")
        infos = [self._info(row) for row in rows if not (self.transactional and row[-1])]
        full = len(rows) == limit
        return LockPage(infos, rows[-1][0] if full else None)

    def _info(self, row: tuple[Any, ...]) -> LockInfo:
        key, owner, fencing, acquired_at, expires_at, host, pid, thread = row[:8]
        if self.transactional:
            # The holder's own writes are not committed: only the name is known.
            return LockInfo(self.alias, self.name_of(key), "", None, None, None, "", None, "")
        from ..lease import short_owner

        return LockInfo(
            alias=self.alias,
            name=self.name_of(key),
            owner=short_owner(owner),
            fencing_token=fencing,
            acquired_at=sql.as_datetime(acquired_at),
            expires_at=sql.as_datetime(expires_at),
            host=host,
            pid=pid,
            thread=thread,
        )

    def force_release(self, name: str) -> bool:
        key = self.make_key(name)
        if self.transactional:
            raise UnsupportedOperation(
                "A transaction-mode lock is held by its holder's open transaction; "
                "it ends when that transaction does."
            )
        params = [key] + ([key, sql.queue_channel(key)] if self.vendor == "postgresql" else [])
        freed = bool(self._run(self.dialect.force_release, params, "force-releasing a lock"))
        if freed:
            from ..signals import lock_force_released

            lock_force_released.send(
                sender=type(self), backend=self, alias=self.alias, name=name, fencing_token=None
            )
        return freed

    def health(self) -> float:
        started = time.perf_counter()
        self._run("SELECT 1", [], "checking health")
        return time.perf_counter() - started

    # -- transaction mode -------------------------------------------------------

    def _tx_acquire(self, lock: Lock, wait: float | None) -> Grant | Miss:
        if lock.key in self._tx_stack.keys:
            # Held by another handle on this thread's connection (another task
            # of the same thread, say): the row lock would let us in, we don't.
            return Miss()
        connection = connections[self.database]
        atomic = transaction.atomic(using=self.database)
        if self.vendor == "sqlite":
            return self._sqlite_tx_acquire(lock, wait, connection, atomic)
        try:
            atomic.__enter__()
        except Error as exc:
            raise self._unavailable(exc, "opening the lock's transaction") from exc
        try:
            with connection.cursor() as cursor:
                if wait == 0:
                    cursor.execute(sql.PG_TX_NOWAIT, [lock.key])  # select_for_update(nowait=True)
                    found = cursor.fetchone() is not None
                else:
                    timeout = "0" if wait is None else f"{max(1, math.ceil(wait * 1000))}ms"
                    cursor.execute(sql.PG_LOCK_TIMEOUT, [timeout])
                    found = True
                # The UPDATE takes (or, after NOWAIT, keeps) the row lock.
                row = self._tx_grant(cursor, lock) if found else None
        except Error as exc:
            atomic.__exit__(type(exc), exc, exc.__traceback__)
            if _is_busy(exc):
                return Miss()
            raise self._unavailable(exc, "acquiring a lock") from exc
        if row is None:
            # First use of the name: commit its row where everyone sees it, then lock it.
            atomic.__exit__(None, None, None)
            self._run(sql.ENSURE_ROW, [lock.key], "creating a lock row", fetch=False)
            return self._tx_acquire(lock, wait)
        return self._tx_granted(lock, atomic, *row)

    def _tx_grant(self, cursor: Any, lock: Lock) -> tuple[int, Any] | None:
        cursor.execute(self.dialect.tx_grant, [lock.host, lock.pid, lock.thread, lock.key])
        row: tuple[int, Any] | None = cursor.fetchone()
        return row

    def _sqlite_tx_acquire(
        self, lock: Lock, wait: float | None, connection: Any, atomic: transaction.Atomic
    ) -> Grant | Miss:
        busy_ms = 2**31 - 1 if wait is None else math.ceil(wait * 1000)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout")
            previous = cursor.fetchone()[0]
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
            try:
                try:
                    atomic.__enter__()
                except Error as exc:
                    if _is_busy(exc):
                        return Miss()
                    raise self._unavailable(exc, "opening the lock's transaction") from exc
                try:
                    row = self._tx_grant(cursor, lock)
                    if row is None:  # first use of the name; the write lock is ours
                        cursor.execute(sql.ENSURE_ROW, [lock.key])
                        row = self._tx_grant(cursor, lock)
                    assert row is not None
                    fencing, acquired_at = row
                except Error as exc:
                    atomic.__exit__(type(exc), exc, exc.__traceback__)
                    if _is_busy(exc):
                        return Miss()
                    raise self._unavailable(exc, "acquiring a lock") from exc
            finally:
                cursor.execute(f"PRAGMA busy_timeout = {int(previous)}")
        return self._tx_granted(lock, atomic, fencing, acquired_at)

    def _tx_granted(
        self, lock: Lock, atomic: transaction.Atomic, fencing: int, acquired_at: Any
    ) -> Grant:
        grant = Grant(fencing, sql.as_datetime(acquired_at), None)
        lock.backend_state = _TxState(atomic, threading.get_ident(), grant)
        self._tx_stack.keys.append(lock.key)
        return grant

    def _tx_state(self, lock: Lock, doing: str) -> _TxState:
        state = lock.backend_state
        if not isinstance(state, _TxState):
            raise UnsupportedOperation(f"{lock!r} has no open transaction.")
        if state.thread != threading.get_ident():
            raise UnsupportedOperation(
                f"A transaction-mode lock is its thread's open transaction; it must be {doing} "
                "by the thread that acquired it."
            )
        return state

    def _sqlite_write_locked(self) -> bool:
        """Whether some connection holds the SQLite database's write lock."""
        path = connections[self.database].settings_dict["NAME"]
        try:
            probe = sqlite3.connect(str(path), timeout=0, isolation_level=None)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"Could not open SQLite database {path!r}: {exc}") from exc
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return True
            raise BackendUnavailable(f"SQLite database {path!r} failed: {exc}") from exc
        finally:
            probe.close()


def _pg_cursor(raw: Any) -> Any:
    """A server-side binding cursor on a raw psycopg 3 (or psycopg2) connection."""
    try:
        import psycopg
    except ImportError:
        return raw.cursor()  # psycopg2 binds client-side; it cannot prepare
    if isinstance(raw, psycopg.Connection):
        return psycopg.Cursor(raw)
    return raw.cursor()


def _client_errors() -> tuple[type[BaseException], ...]:
    """Django's database errors and the raw drivers' (lease statements on PostgreSQL)."""
    errors: list[type[BaseException]] = [Error]
    for module in ("psycopg", "psycopg2"):
        with contextlib.suppress(ImportError):
            errors.append(__import__(module).Error)
    return tuple(errors)


_ERRORS = _client_errors()


def _is_busy(exc: BaseException) -> bool:
    """Whether a database error means "held by someone else" rather than a failure."""
    for err in (exc, exc.__cause__):
        if getattr(err, "sqlstate", None) == "55P03":  # PostgreSQL lock_not_available
            return True
        if getattr(err, "pgcode", None) == "55P03":  # psycopg2
            return True
    message = str(exc).lower()
    return isinstance(exc, DatabaseError) and (
        "database is locked" in message or "database table is locked" in message
    )


def _is_psycopg3(database: str) -> bool:
    """LISTEN/NOTIFY waiting needs psycopg 3.3: ``notifies(timeout=...)``, and notifications
    that arrive during another statement kept for the next ``notifies()``."""
    try:
        import psycopg
    except ImportError:
        return False
    if getattr(connections[database], "Database", None) is not psycopg:
        return False
    major, minor = (int(part) for part in psycopg.__version__.split(".")[:2])
    return (major, minor) >= (3, 3)
