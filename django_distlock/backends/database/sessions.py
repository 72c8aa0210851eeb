"""Connections of the database backend's own (PostgreSQL, MySQL), apart from Django's.

Lease statements run on autocommit connections of their own, so a lease
never joins, and is never rolled back with, the caller's transaction:

- one per thread (:class:`ThreadSessions`), for threads;
- a bounded pool per event loop (:class:`AsyncSessions`), for asyncio tasks:
  a task keeps one session from its first attempt to its release, and its
  calls run in a thread pool, so its waits in the server never block the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar, overload

from django.db import Error, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .errors import ERRORS, row_wait_timed_out
from .mysql_sql import KILL_QUERY, MYSQL_UNLOCK_GENERATION
from .mysql_sql import SESSION_SETUP as MYSQL_SESSION_SETUP
from .sql import PG_SESSION_SETUP, PG_UNLOCK_GENERATION

T = TypeVar("T")
#: An orphan of this "generation" is a read lock's or a permit's hold of its name's bell,
#: a shared advisory lock (sql/postgresql.sql), not a grant's generation lock.
SHARES_BELL = -4
PG_UNLOCK_BELL = "SELECT pg_advisory_unlock_shared(hashtextextended(%s, %s))"

#: Longest a lease statement waits for a row lock held by someone else's
#: transaction before the attempt counts as a miss (lease rows are locked
#: only for the duration of one statement).
ROW_LOCK_WAIT = "200ms"
#: How often a lease connection's server process checks, while it waits in a
#: statement, that its client is still connected.
CLIENT_CHECK = "1s"
#: A blocking acquire of a key its session waited for in the last this many seconds
#: goes straight to the server's queue (one round trip instead of a miss and then
#: the wait); remembered per session for this many keys at most.
CONTENDED_FOR = 10.0
CONTENDED_KEYS = 256


def note_contended(recent: dict[str, float], key: str) -> None:
    """Record in ``recent`` (key → when, oldest first) that ``key`` is waited for now,
    keeping the :data:`CONTENDED_KEYS` latest (a session's, or session mode's backend's)."""
    recent.pop(key, None)
    recent[key] = time.monotonic()
    if len(recent) > CONTENDED_KEYS:
        recent.pop(next(iter(recent)), None)


def retry_row_waits(run: Callable[[], T], until: float) -> T:
    """Run a statement again while it fails only for waiting longer than
    :data:`ROW_LOCK_WAIT` (MySQL: a second) for another transaction's lock of a row (a
    waiter's grant or reservation, held until its commit is flushed), until ``until``
    (monotonic). For a statement whose row-lock wait comes before anything it does
    outside its transaction (a lease release: its ``UPDATE`` is its first step), so that
    a failed try changed nothing.

    :param run: the statement, on a session the caller holds.
    :param until: past it, a row-lock timeout is raised like any error.
    :returns: what ``run`` returns.
    :raises Exception: ``run``'s error, when it is not a row-lock timeout or ``until`` has
        passed.
    """
    while True:
        try:
            return run()
        except ERRORS as exc:
            if not row_wait_timed_out(exc) or time.monotonic() >= until:
                raise


class Session:
    """One autocommit connection for lease statements.

    Statements run holding ``mutex``. ``orphans``: generation locks of leases
    granted here but released through another session while this one was
    busy (or shares' bells, :data:`SHARES_BELL`), given back here before the next
    statement.
    """

    def __init__(self, wrapper: BaseDatabaseWrapper, cursor: Any, prepare: bool | None) -> None:
        self.wrapper = wrapper
        self.cursor = cursor
        #: psycopg's ``prepare`` argument (the backend's ``OPTIONS["PREPARE"]``); None for
        #: a driver that has none (MySQLdb).
        self.prepare = prepare
        self.pid = os.getpid()
        raw = wrapper.connection
        # Read now: MySQLdb refuses calls from another thread while a statement runs,
        # and these serve cancel() and cut(), which another thread calls then.
        self._fileno: int = raw.fileno()
        #: MySQL's connection id (``KILL QUERY`` stops its statement); None on PostgreSQL.
        self._thread_id: int | None = raw.thread_id() if wrapper.vendor == "mysql" else None
        #: psycopg 3's libpq connection (None on another driver), and the names of the
        #: statements prepared on it by ``prepared.fetch`` (session mode's).
        self.pgconn: Any = getattr(raw, "pgconn", None)
        self.prepared: set[bytes] = set()
        #: Session mode on MySQL: what the session's grants through the procedure told it
        #: (``session_mysql.SessionRun``), None before the first.
        self.mysql_run: Any = None
        self.mutex = threading.Lock()
        self.orphans: list[tuple[str, int]] = []
        self.closed = False
        #: The watchdog cut the connection: the server did not answer in time.
        self.timed_out = False
        #: When the watchdog cuts the connection (monotonic): set while a call runs
        #: (with ``mutex`` held; :func:`watched`), else None.
        self.until: float | None = None
        #: Keys this session recently had to wait for, and when (monotonic), oldest first.
        self._contended: dict[str, float] = {}
        WATCHDOG.add(self)

    def contended(self, key: str) -> bool:
        """Whether this session waited for ``key`` in the last :data:`CONTENDED_FOR` s."""
        seen = self._contended.get(key)
        return seen is not None and time.monotonic() - seen < CONTENDED_FOR

    def note_contended(self, key: str) -> None:
        """Remember that this session waits for ``key`` (at most :data:`CONTENDED_KEYS`)."""
        note_contended(self._contended, key)

    @property
    def usable(self) -> bool:
        """Open, this process' own, and not cut by the watchdog (a cut may land just as
        its call returned: the next call must not use the session)."""
        return not self.closed and not self.timed_out and self.pid == os.getpid()

    def execute(self, statement: str, params: Any) -> Any:
        """Run one statement (``mutex`` held); return the cursor."""
        while self.orphans:
            key, generation = self.orphans.pop()
            if self._thread_id is not None:  # MySQL
                self.cursor.execute(MYSQL_UNLOCK_GENERATION, [key, generation])
                continue
            unlock = PG_UNLOCK_BELL if generation == SHARES_BELL else PG_UNLOCK_GENERATION
            self.cursor.execute(unlock, [key, generation], prepare=False)
        if self.prepare is None:
            self.cursor.execute(statement, params)
        else:
            self.cursor.execute(statement, params, prepare=self.prepare)
        return self.cursor

    def cancel(self) -> None:
        """Ask the server to stop this session's running statement, if any, and return
        once the server has taken the request. Only through :meth:`Call.cancel` (which
        orders it before the session's next statement) or on a session closed right
        after: a request stops *whatever* the session runs when it arrives.

        If the server does not confirm it, the request may still land later, on a
        statement it was not meant for: the session is then cut, never used again."""
        if self._thread_id is not None:  # MySQL
            self._kill_query(self._thread_id)
            return
        raw = self.wrapper.connection
        try:
            # Both wait until the server has signalled the session's process: psycopg's
            # cancel_safe (>= 3.2) for its answer, libpq's PQcancel (cancel()) for the
            # postmaster to close the request's connection.
            if hasattr(raw, "cancel_safe"):
                raw.cancel_safe(timeout=5.0)
            else:
                raw.cancel()
        except Exception:
            self.cut()

    def _kill_query(self, thread_id: int) -> None:
        """MySQL: stop the session's statement by ``KILL QUERY`` from a connection of its
        own (the driver has no cancel call); returns once the server has taken it. A
        wait in ``GET_LOCK`` or ``SLEEP`` returns (NULL, 1) rather than failing, so the
        lease procedures leave by themselves; a kill that finds the session idle is
        dropped (its next statement runs)."""
        side = connections.create_connection(self.wrapper.alias)
        try:
            side.ensure_connection()
            with side.connection.cursor() as cursor:
                cursor.execute(KILL_QUERY, [thread_id])
        except Exception:
            self.cut()
        finally:
            with contextlib.suppress(Exception):
                side.close()

    def cut(self) -> None:
        """Shut the connection's socket down under the running call (any thread): the
        call then fails at once instead of waiting for a server that does not answer."""
        self.timed_out = True
        with contextlib.suppress(Exception):
            fd = os.dup(self._fileno)
            with socket.socket(fileno=fd) as sock:
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the connection; the server frees the advisory locks it held."""
        self.closed = True
        if self.pid == os.getpid():
            with contextlib.suppress(Error):
                self.wrapper.close()


class CallCancelled(Exception):
    """A :class:`Call` was cancelled before its statement was sent: nothing was run."""


class Call:
    """One statement run on a session that another thread may stop (a cancelled
    asyncio task's wait, still running in the server).

    A cancel request stops whatever its session runs when it arrives, so it must
    reach this call's statement and never a later one (the release of a grant
    that came meanwhile, say). :meth:`cancel` sends it only while the statement
    runs, and :meth:`running_on`'s exit waits for a request in flight: the server
    has taken it before the session's next statement is sent, and a cancel
    signal that finds its session idle is dropped by the server.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._session: Session | None = None
        self.cancelled = False

    @contextlib.contextmanager
    def running_on(self, session: Session) -> Iterator[None]:
        """Run the statement of this call on ``session`` within the block.

        :raises CallCancelled: if :meth:`cancel` came first (nothing is sent).
        """
        with self._mutex:
            if self.cancelled:
                raise CallCancelled
            self._session = session
        try:
            yield
        finally:
            with self._mutex:  # waits for a cancel request in flight
                self._session = None

    def cancel(self) -> None:
        """Stop this call: its running statement (returns once the server has taken the
        request), or the statement before it is sent; nothing after it."""
        with self._mutex:
            self.cancelled = True
            if self._session is not None:
                self._session.cancel()


#: How long past its deadline a call may go before the watchdog cuts its connection
#: (a wait in the server ends at the deadline by itself; this covers the answer's way).
WATCHDOG_GRACE = 2.0


#: How often the watchdog looks at the sessions' calls, in seconds: a call is cut at most
#: this long after its deadline plus :data:`WATCHDOG_GRACE`.
WATCHDOG_TICK = 0.25


class Watchdog:
    """Cuts the connection of a call that runs past its deadline plus
    :data:`WATCHDOG_GRACE` (a frozen or unreachable server): one thread per process,
    which looks at the open sessions every :data:`WATCHDOG_TICK` seconds.

    A call is watched through its session's :attr:`Session.until`, set before it and
    cleared after it with the session's mutex held (:func:`watched`): one call at a
    time per session, and two attribute writes on the hot path, no lock or queue.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self._pid = 0

    def add(self, session: Session) -> None:
        """Look after ``session``'s calls from now on (when it opens; a closed or collected
        one drops out)."""
        with self._cond:
            if self._pid != os.getpid():  # the first here, or a forked child's first
                self._pid = os.getpid()
                self._sessions = weakref.WeakSet()
                threading.Thread(target=self._run, name="django-distlock-watchdog",
                                 daemon=True).start()
            self._sessions.add(session)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._sessions:
                    self._cond.wait()
                sessions = list(self._sessions)  # under the lock: add() may run meanwhile
            _cut_overdue(sessions)
            del sessions  # not kept through the sleep: a dropped session is let go
            time.sleep(WATCHDOG_TICK)


def _cut_overdue(sessions: list[Session]) -> None:
    """Cut the connection of each of ``sessions`` whose call runs past its bound."""
    now = time.monotonic()
    for session in sessions:
        until = session.until
        if until is not None and now >= until and not session.timed_out:
            session.cut()


WATCHDOG = Watchdog()


@contextlib.contextmanager
def watched(session: Session, deadline: float | None) -> Iterator[None]:
    """Have the watchdog cut ``session``'s connection if the call in the block has not
    returned by ``deadline`` (monotonic; None: never) plus :data:`WATCHDOG_GRACE`. Hold
    the session's mutex around the block."""
    if deadline is None:
        yield
        return
    session.until = deadline + WATCHDOG_GRACE
    try:
        yield
    finally:
        session.until = None


class SessionFactory:
    """Opens sessions on one database alias, and closes them all on :meth:`close_all`."""

    def __init__(self, database: str, prepare: bool) -> None:
        self.database = database
        self.prepare = prepare
        #: Statements a mode adds to each session's setup (a round trip each when it
        #: opens): a callable giving them, as (statement, params), then.
        self.setup: Callable[[], list[tuple[str, list[Any] | None]]] | None = None
        self._mutex = threading.Lock()
        # Weak: a finished thread's session is closed when collected.
        self._open: weakref.WeakSet[Session] = weakref.WeakSet()

    def open(self, bound: float | None = None) -> Session:
        """Connect and set the session up (one round trip after the connect).

        :param bound: the deadline (monotonic) of the call that needs the session: the
            connect gives up by then plus :data:`WATCHDOG_GRACE`, as the watchdog does
            for the call itself (libpq counts whole seconds, 2 at least).
        """
        wrapper = connections.create_connection(self.database)
        if bound is not None:
            _bound_connect(wrapper, bound)
        wrapper.inc_thread_sharing()  # used, and closed, from other threads too
        wrapper.ensure_connection()
        raw = wrapper.connection
        if wrapper.vendor == "mysql":
            cursor, prepare = raw.cursor(), None  # MySQLdb: no server-side prepare
            setup: list[tuple[str, list[Any] | None]] = [
                (statement, None) for statement in MYSQL_SESSION_SETUP]
        else:
            if self.prepare and hasattr(raw, "prepare_threshold"):
                # Django turns preparing off for every connection; this one is ours.
                raw.prepare_threshold = 0
            cursor, prepare = _pg_cursor(raw), self.prepare
            setup = [(PG_SESSION_SETUP, [ROW_LOCK_WAIT, CLIENT_CHECK])]
        if self.setup is not None:
            setup.extend(self.setup())
        try:
            for statement, params in setup:
                cursor.execute(statement, params)
        except BaseException:
            wrapper.close()
            raise
        session = Session(wrapper, cursor, prepare)
        with self._mutex:
            self._open.add(session)
        return session

    def close_all(self) -> None:
        with self._mutex:
            sessions, self._open = list(self._open), weakref.WeakSet()
        for session in sessions:
            session.close()


def _bound_connect(wrapper: BaseDatabaseWrapper, bound: float) -> None:
    """Make ``wrapper``'s connect give up by ``bound`` + the grace (a partitioned or frozen
    server: psycopg waits 130 s by default), unless its ``connect_timeout`` is shorter."""
    seconds = max(2, math.ceil(bound + WATCHDOG_GRACE - time.monotonic()))
    options = wrapper.settings_dict.get("OPTIONS") or {}
    try:
        given = float(options.get("connect_timeout") or 0)
    except (TypeError, ValueError):
        return  # psycopg reports it
    if given <= 0 or seconds < given:  # a copy: the settings' dict is shared
        wrapper.settings_dict = {**wrapper.settings_dict,
                                 "OPTIONS": {**options, "connect_timeout": seconds}}


class _Local(threading.local):
    session: Session | None = None


class ThreadSessions:
    """One session per thread, opened on first use and after a fork or a failure.

    A thread's session is closed once the thread has ended, at the next session opened
    (an ASGI server runs each request's sync code in a thread of its own: without this,
    each request would leave a connection open until the garbage collector ran).
    """

    def __init__(self, factory: SessionFactory) -> None:
        self.factory = factory
        self._local = _Local()
        self._mutex = threading.Lock()
        self._owners: dict[Session, threading.Thread] = {}

    def get(self, bound: float | None = None) -> Session:
        """This thread's session; one opened by ``bound`` (see :meth:`SessionFactory.open`)
        if it has none."""
        session = self._local.session
        if session is None or not session.usable:
            self._local.session = None
            if session is not None:
                self._disown(session)
                session.close()  # cut, or inherited: closes only this process' own
            self._close_ended()
            session = self._local.session = self.factory.open(bound)
            with self._mutex:
                self._owners[session] = threading.current_thread()
        return session

    def _disown(self, session: Session) -> None:
        with self._mutex:
            self._owners.pop(session, None)

    def _close_ended(self) -> None:
        """Close the sessions of threads that have ended."""
        with self._mutex:
            ended = [s for s, thread in self._owners.items() if not thread.is_alive()]
            for session in ended:
                del self._owners[session]
        for session in ended:
            session.close()

    def current(self) -> Session | None:
        """This thread's session, if it has one (no I/O)."""
        return self._local.session

    def forget(self, session: Session | None = None) -> None:
        """Close this thread's session (or ``session`` if it is this thread's)."""
        current = self._local.session
        if current is not None and (session is None or session is current):
            self._local.session = None
            self._disown(current)
            current.close()

    def reset(self) -> None:
        self._local = _Local()
        with self._mutex:
            self._owners = {}


class SessionPool:
    """Sessions each lent to one acquisition at a time (session mode: a session holds
    the lock it was granted until the release), for threads: taken at the first attempt,
    given back at the release or when the acquisition ends without a grant. At most
    ``keep`` idle ones are kept open; the rest are closed as they come back."""

    def __init__(self, factory: SessionFactory, keep: int) -> None:
        self.factory = factory
        self.keep = keep
        self._idle: list[Session] = []
        self._mutex = threading.Lock()

    @overload
    def take(self, bound: float | None = None) -> Session: ...
    @overload
    def take(self, bound: float | None, opening: Literal[False]) -> Session | None: ...

    def take(self, bound: float | None = None, opening: bool = True) -> Session | None:
        """The idle session given back last that is still usable (the unusable ones met
        on the way are closed), else one opened by ``bound`` (see
        :meth:`SessionFactory.open`); with ``opening`` False, None instead."""
        while self._idle:
            try:
                session = self._idle.pop()  # atomic: no mutex on the hot path
            except IndexError:
                break
            if session.usable:
                return session
            session.close()  # cut, or inherited over a fork: closes only our own
        return self.factory.open(bound) if opening else None

    def give_back(self, session: Session) -> None:
        """Keep ``session`` for the next acquisition (one that holds nothing), unless it is
        unusable or ``keep`` are idle already."""
        if session.usable:
            with self._mutex:
                if len(self._idle) < self.keep:
                    self._idle.append(session)
                    return
        session.close()

    def close(self) -> None:
        with self._mutex:
            idle, self._idle = self._idle, []
        for session in idle:
            session.close()


class AsyncSessions:
    """Sessions for asyncio tasks: at most ``size`` taken per event loop at a time
    (a task waits, in order, for one to come back); calls run in a thread pool."""

    def __init__(self, factory: SessionFactory, size: int) -> None:
        self.factory = factory
        self.size = size
        #: The sessions given back, for the next task of any loop.
        self._idle = SessionPool(factory, size)
        self._mutex = threading.Lock()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._executor: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    async def take(self, timeout: float | None) -> Session | None:
        """A session for this task, or None if none came back within ``timeout``."""
        slots = self._slots_of_this_loop()
        if slots.locked():
            if timeout is not None and timeout <= 0:
                return None
            try:
                await asyncio.wait_for(slots.acquire(), timeout)
            except TimeoutError:
                return None
        else:
            await slots.acquire()  # free: does not wait (wait_for(..., 0) would refuse)
        try:
            session = self._idle.take(None, opening=False)
            if session is not None:
                return session
            opening = asyncio.ensure_future(self.run(self.factory.open))
            try:
                return await asyncio.shield(opening)
            except asyncio.CancelledError:  # the session opens all the same: keep it
                opening.add_done_callback(self._keep)
                raise
        except BaseException:
            slots.release()
            raise

    def _keep(self, opening: asyncio.Future[Session]) -> None:
        """A session opened for a task cancelled meanwhile joins the idle ones."""
        if not opening.cancelled() and opening.exception() is None:
            self._idle.give_back(opening.result())

    def give_back(self, session: Session, loop: asyncio.AbstractEventLoop) -> None:
        """Return a session taken on ``loop`` (closed ones are dropped)."""
        self._idle.give_back(session)
        slots = self._slots.get(loop)
        if slots is not None and not loop.is_closed():
            loop.call_soon_threadsafe(slots.release)

    async def run(self, func: Callable[[], T]) -> T:
        """Run ``func`` in the pool's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._pool(), func)

    def _slots_of_this_loop(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = asyncio.Semaphore(self.size)
        return slots

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None or self._pid != os.getpid():
            with self._mutex:
                if self._executor is None or self._pid != os.getpid():
                    self._pid = os.getpid()
                    self._idle = SessionPool(self.factory, self.size)  # the parent's
                    self._executor = ThreadPoolExecutor(
                        max_workers=self.size, thread_name_prefix="django-distlock-async"
                    )
        return self._executor

    def close(self) -> None:
        with self._mutex:
            executor, self._executor = self._executor, None
        self._idle.close()
        if executor is not None and self._pid == os.getpid():
            executor.shutdown(wait=False, cancel_futures=True)


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
