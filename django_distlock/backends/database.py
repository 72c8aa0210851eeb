"""The database backend: a lock row per key, on PostgreSQL or SQLite.

Two modes, chosen with ``OPTIONS["MODE"]``:

``"lease"`` (default)
    The row records the owner and an expiry from the database's clock. Each
    operation is one autocommit statement; on PostgreSQL they run on a
    connection of their own (one per thread), so a lease never joins, and is
    never rolled back with, the caller's transaction. On PostgreSQL a waiting
    thread queues in the server and a release hands the lock over to it
    (migration 0002 explains how); asyncio waiters are woken by LISTEN/NOTIFY.
    On SQLite waiters back off with jitter.

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
from ._pglisten import Listener, NotificationWaiter
from .base import BaseLockBackend, Grant, LockInfo, LockPage, Miss, Waiter, validate_page_args

if TYPE_CHECKING:
    from ..lease import Lock

MODES = ("lease", "transaction")
_OPTION_KEYS = frozenset({"DATABASE", "MODE", "PREPARE"})
#: Longest a lease statement waits for a row lock held by someone else's
#: transaction before the attempt counts as a miss (lease rows are locked
#: only for the duration of one statement).
_ROW_LOCK_WAIT = "200ms"
#: How often a lease connection's server process checks, while it waits in a
#: statement, that its client is still connected.
_CLIENT_CHECK = "1s"
#: A blocking acquire of a key its thread waited for in the last this many seconds
#: goes straight to the server's queue (one round trip instead of a miss and then
#: the wait); remembered per thread for this many keys at most.
_CONTENDED_FOR = 10.0
_CONTENDED_KEYS = 256


@dataclass
class _TxState:
    """A transaction-mode acquisition: its open atomic block and its thread."""

    atomic: transaction.Atomic
    thread: int
    grant: Grant


#: ``Lock.backend_state`` of a lease-mode acquisition past its first attempt: a thread's
#: waits in the server (``_QUEUED``), an asyncio task's polls after notifications
#: (``_WAITING``, which may pass a queued waiter: the task cannot queue).
_QUEUED = "queued"
_WAITING = "waiting"


class _TxStack(threading.local):
    """This thread's transaction-mode acquisitions, innermost last."""

    def __init__(self) -> None:
        self.keys: list[str] = []


class _Session:
    """A thread's own autocommit connection for lease statements (PostgreSQL).

    Its owning thread runs every statement holding ``mutex``; another thread
    may too, to release a lease granted here (the session holds the grant's
    generation lock). ``orphans``: generation locks of leases released
    through another session while this one was busy, given back here before
    the next statement.
    """

    def __init__(self, wrapper: BaseDatabaseWrapper, cursor: Any, prepare: bool) -> None:
        self.wrapper = wrapper
        self.cursor = cursor
        #: psycopg's ``prepare`` argument (the backend's ``OPTIONS["PREPARE"]``).
        self.prepare = prepare
        self.pid = os.getpid()
        self.mutex = threading.Lock()
        self.orphans: list[tuple[str, int]] = []
        self.closed = False
        #: Keys this thread recently had to wait for, and when (monotonic), oldest first.
        self._contended: dict[str, float] = {}

    def contended(self, key: str) -> bool:
        """Whether this thread waited for ``key`` in the last :data:`_CONTENDED_FOR` seconds."""
        seen = self._contended.get(key)
        return seen is not None and time.monotonic() - seen < _CONTENDED_FOR

    def note_contended(self, key: str) -> None:
        """Remember that this thread waits for ``key`` (at most :data:`_CONTENDED_KEYS` keys)."""
        self._contended.pop(key, None)
        self._contended[key] = time.monotonic()
        if len(self._contended) > _CONTENDED_KEYS:
            del self._contended[next(iter(self._contended))]

    def cancel(self) -> None:
        """Ask the server to stop this session's running statement, if any."""
        raw = self.wrapper.connection
        with contextlib.suppress(Exception):
            if hasattr(raw, "cancel_safe"):  # psycopg >= 3.2: waits for the answer
                raw.cancel_safe(timeout=5.0)
            else:
                raw.cancel()

    def execute(self, statement: str, params: list[Any]) -> Any:
        """Run one statement (``mutex`` held); return the cursor."""
        while self.orphans:
            key, generation = self.orphans.pop()
            self.cursor.execute(sql.PG_UNLOCK_GENERATION, [key, generation], prepare=False)
        self.cursor.execute(statement, params, prepare=self.prepare)
        return self.cursor


@dataclass(frozen=True)
class _Held:
    """A lease-mode grant on PostgreSQL: the session that holds its generation lock."""

    session: _Session
    generation: int


class _LeaseSessions(threading.local):
    session: _Session | None = None


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
        self._local = _LeaseSessions()
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
        self._local = _LeaseSessions()

    # -- connections ----------------------------------------------------------

    def _session(self) -> _Session:
        """This thread's session for lease statements on PostgreSQL.

        A psycopg cursor with server-side binding on the thread's own
        autocommit connection, so that the lease statements are prepared once
        per connection (set the backend's ``OPTIONS["PREPARE"]`` to False
        behind a pooler that cannot keep prepared statements, such as
        PgBouncer's transaction pooling before 1.21).
        """
        session = self._local.session
        if session is None or session.pid != os.getpid():
            self._local.session = None
            wrapper = self._new_wrapper()
            raw = wrapper.connection
            if self.prepare and hasattr(raw, "prepare_threshold"):
                # Django turns preparing off for every connection; this one is ours.
                raw.prepare_threshold = 0
            cursor = _pg_cursor(raw)
            cursor.execute(sql.PG_SESSION_SETUP, [_ROW_LOCK_WAIT, _CLIENT_CHECK])
            session = self._local.session = _Session(wrapper, cursor, self.prepare)
        return session

    def _new_wrapper(self) -> BaseDatabaseWrapper:
        wrapper = connections.create_connection(self.database)
        wrapper.inc_thread_sharing()  # close() may run on another thread
        wrapper._distlock_pid = os.getpid()  # type: ignore[attr-defined]
        wrapper.ensure_connection()
        with self._mutex:
            self._wrappers.add(wrapper)
        return wrapper

    def _forget_session(self) -> None:
        """Close this thread's session; the server frees the advisory locks it held."""
        session, self._local.session = self._local.session, None
        if session is not None:
            session.closed = True
            with contextlib.suppress(Error):
                session.wrapper.close()

    def _unavailable(self, exc: BaseException, doing: str) -> BackendUnavailable:
        self._forget_session()
        if getattr(exc, "sqlstate", None) == "42883":  # undefined_function
            return BackendUnavailable(
                f"Database {self.database!r} lacks django-distlock's procedures: run "
                f"`manage.py migrate django_distlock` (lock alias {self.alias!r}): {exc}"
            )
        return BackendUnavailable(
            f"Database {self.database!r} failed while {doing} (lock alias {self.alias!r}): {exc}"
        )

    def _run(
        self, statement: str, params: list[Any], doing: str, fetch: bool = True
    ) -> list[tuple[Any, ...]]:
        """Run one lease statement and return its rows; map failures to BackendUnavailable."""
        try:
            if self.vendor != "postgresql":
                with connections[self.database].cursor() as cursor:
                    cursor.execute(statement, params)
                    return cursor.fetchall() if fetch else []
            session = self._session()
            with session.mutex:
                cursor = session.execute(statement, params)
                return cursor.fetchall() if fetch else []
        except _ERRORS as exc:
            raise self._unavailable(exc, doing) from exc

    def _ttl(self, seconds: float) -> object:
        return sql.sqlite_ttl(seconds) if self.vendor == "sqlite" else seconds

    # -- lease mode -------------------------------------------------------------

    def try_acquire(self, lock: Lock, token: str, wait: float | None) -> Grant | Miss:
        if self.transactional:
            return self._tx_acquire(lock, wait)
        if self.vendor != "postgresql":
            return self._sqlite_acquire(lock, token)
        holder: list[Any] = [lock.host, lock.pid, lock.thread]
        try:
            session = self._session()
        except _ERRORS as exc:
            raise self._unavailable(exc, "connecting") from exc
        queue = wait != 0 and not lock.in_event_loop
        if queue and (lock.backend_state is _QUEUED or session.contended(lock.key)):
            # A thread's wait (or a first attempt on a key seen contended): in the
            # server, in the key's queue (see migration 0002).
            session.note_contended(lock.key)
            statement, params = sql.PG_WAIT, [lock.key, token, lock.ttl, *holder, wait]
        else:
            statement = self.dialect.acquire
            retry = lock.backend_state is _WAITING
            params = sql.pg_acquire_params(
                lock.key, token, lock.ttl, lock.host, lock.pid, lock.thread, retry=retry
            )
        try:
            with session.mutex:
                row = session.execute(statement, params).fetchone()
        except _ERRORS as exc:
            if not _is_busy(exc):
                raise self._unavailable(exc, "acquiring a lock") from exc
            if statement is sql.PG_WAIT:
                # Its grant waited too long for a row lock (a transaction-mode holder of
                # the same name?): the session may still hold the queue's advisory lock,
                # and closing it frees that.
                self._forget_session()
            return Miss()
        except BaseException:
            if statement is sql.PG_WAIT:
                # Interrupted (KeyboardInterrupt, say): stop the call in the server
                # (it would wait on, and may be handed the lock), and close the
                # session, which frees the queue and the head's advisory locks.
                session.cancel()
                self._forget_session()
            raise
        if row is None:
            return Miss()
        granted, fencing, acquired_at, expires_at, retry_after, generation = row
        if not granted:
            return Miss(retry_after)
        if generation is not None:
            lock.backend_state = _Held(session, generation)
        return Grant(fencing, sql.as_datetime(acquired_at), sql.as_datetime(expires_at))

    def _sqlite_acquire(self, lock: Lock, token: str) -> Grant | Miss:
        params: list[Any] = [lock.key, token, self._ttl(lock.ttl), lock.host, lock.pid, lock.thread]
        assert self.dialect.retry_after is not None  # SQLite's
        try:
            with connections[self.database].cursor() as cursor:
                cursor.execute(self.dialect.acquire, params)
                row = cursor.fetchone()
                if row is None:
                    # The miss path's second statement (local, cheap).
                    cursor.execute(self.dialect.retry_after, [lock.key])
                    found = cursor.fetchone()
                    return Miss(found[0] if found else None)
        except _ERRORS as exc:
            if _is_busy(exc):
                return Miss()
            raise self._unavailable(exc, "acquiring a lock") from exc
        _, fencing, acquired_at, expires_at, _, _ = row
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
        if self.vendor != "postgresql":
            rows = self._run(self.dialect.release, [lock.key, token], "releasing a lock")
            return bool(rows and rows[0][0])
        held = lock.backend_state if isinstance(lock.backend_state, _Held) else None
        if held is not None and held.session is not self._local.session:
            released = self._release_through(held, lock.key, token)
            if released is not None:
                return released
        own = held is not None and held.session is self._local.session
        generation = held.generation if own and held is not None else None
        params = sql.pg_release_params(lock.key, token, generation)
        rows = self._run(self.dialect.release, params, "releasing a lock")
        return bool(rows and rows[0][0])

    def _release_through(self, held: _Held, key: str, token: str) -> bool | None:
        """Release a lease granted on another thread's session, through that session.

        Its generation lock lives there. If that session is busy, return None
        (the caller releases through its own) and leave the generation lock to
        be given back there before its next statement.
        """
        session = held.session
        if session.closed or session.pid != os.getpid():
            return None  # its connection is gone, and its locks with it
        if not session.mutex.acquire(blocking=False):
            session.orphans.append((key, held.generation))
            return None
        try:
            params = sql.pg_release_params(key, token, held.generation)
            row = session.execute(self.dialect.release, params).fetchone()
            return bool(row and row[0])
        except _ERRORS:
            return None  # that connection broke (and its locks went with it): use ours
        finally:
            session.mutex.release()

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
        """PostgreSQL lease mode: a thread waits in the server, in the key's queue (one
        call per wait; see ``try_acquire``); an asyncio task must not block its
        thread there, so it waits for the listener's notifications."""
        if self.transactional or not self.wakes_waiters:
            return Waiter()
        if not lock.in_event_loop:
            return _Marked(lock, _QUEUED, Waiter())
        if not self._notifies:
            return _Marked(lock, _WAITING, Waiter())
        if self._listener is None:
            with self._mutex:
                if self._listener is None:
                    self._listener = Listener(self._listen_connection)
        return _Marked(lock, _WAITING, NotificationWaiter(self._listener, lock.key))

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
        params = [key] + ([key] if self.vendor == "postgresql" else [])
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


class _Marked(Waiter):
    """Marks a lease-mode acquisition's later attempts (``mark`` in its ``backend_state``,
    read by ``try_acquire``) and waits as ``inner`` does."""

    def __init__(self, lock: Lock, mark: str, inner: Waiter) -> None:
        super().__init__()
        self.lock, self.mark, self.inner = lock, mark, inner

    def __enter__(self) -> _Marked:
        self.lock.backend_state = self.mark
        self.inner.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.inner.__exit__(*exc_info)
        if self.lock.backend_state is self.mark:
            self.lock.backend_state = None

    def wait(self, miss: Miss, remaining: float | None) -> None:
        self.inner.wait(miss, remaining)

    async def async_wait(self, miss: Miss, remaining: float | None) -> None:
        await self.inner.async_wait(miss, remaining)


def _pg_cursor(raw: Any) -> Any:
    """A server-side binding cursor on a raw psycopg 3 (or psycopg2) connection."""
    try:
        import psycopg
    except ImportError:
        return raw.cursor()  # psycopg2 binds client-side; it cannot prepare
    if isinstance(raw, psycopg.Connection):
        from psycopg.types.datetime import TimestamptzLoader

        cursor = psycopg.Cursor(raw)
        # Django's timestamptz loader is a Python subclass of psycopg's (some 10 µs a
        # value, on the path of every grant); psycopg's own gives the same instants.
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        return cursor
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
