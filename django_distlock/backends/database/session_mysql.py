"""Session mode on MySQL and MariaDB: a lock is a named lock (``GET_LOCK``) held by a
session of the backend's, as session mode on PostgreSQL holds an advisory lock
(``session_mode.py``, whose sessions, grants' table and waits on a holding session this
module keeps).

A name's lock is ``dl:s:`` and 32 hex digits of the SHA-256 of the database's name and
the name (named locks are server-wide and stop at 64 characters). Who holds is a
session's row of a ``MEMORY`` table (name, holder, host, process; not the owner id,
which the server does not keep), which counts while its session holds its lock and
outlives the release. A session's first grant, and a grant beside others, is a
procedure (sql/mysql.sql) that takes the lock, draws the fencing token (an epoch per
server run from a durable counter, and ``UUID_SHORT()`` within the run; sql/mysql.sql
says why not ``UUID_SHORT()`` alone) and writes the row. The session keeps the run's epoch and what
its row says (:class:`SessionRun`): its later grants of the same name by the same holder
are the raw call with the token (``SESSION_GRANT``, ``SESSION_WAIT``: no write), and a
try of another one rewrites the row in one statement (``SESSION_TRY``). The server
queues the waiters, and refuses a wait that closes a cycle (MariaDB 1213, MySQL 3058:
``Deadlock``). The waiters are read from the server's process list, where each waiting
session shows its statement. Force release ends the holder's session (``KILL
CONNECTION``), whoever holds: the server keeps no owner per grant to check it by (a
second named lock per grant did, at 6-9% of every pair; issue 35).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections

from ...kinds import Kind
from ...values import SHORT_OWNER, LockInfo, LockPage, WaiterInfo
from ..base import Freed, HeldCount
from .backend import server_wait
from .errors import ERRORS, mysql_errno
from .mysql_sql import (
    SESSION_COUNT,
    SESSION_FORCE,
    SESSION_GRANT,
    SESSION_HELD,
    SESSION_HOLDS,
    SESSION_IS_LOCKED,
    SESSION_OPEN,
    SESSION_TAKE,
    SESSION_TRY,
    SESSION_UNLOCK,
    SESSION_WAIT,
    SESSION_WAITERS,
)
from .session_acquisition import OwnSessionAcquisition
from .session_mode import (
    SessionAcquisition,
    SessionModeBackend,
    label_text,
    read_holder,
    read_label,
)
from .sessions import Session
from .sql import as_datetime, upper_bound

#: The host recorded with each grant (the table keeps 64 characters).
_HOST = socket.gethostname()[:64]
#: A session of the backend's is never closed by the server for being idle: a holder may
#: hold for hours without a statement (the most MySQL and MariaDB take on Linux: a year).
#: A holder whose machine vanished is found by the server's TCP keepalives instead
#: (docs/guarantees.md).
_NEVER_IDLE_OUT = "SET SESSION wait_timeout = 31536000"
#: A string literal of a statement in the process list, as MySQLdb escapes it.
_LITERAL = re.compile(r"'((?:[^'\\]|\\.)*)'")
_UNESCAPED = {"0": "\0", "n": "\n", "r": "\r", "Z": "\x1a"}
#: The pid in a waiting statement: the number after the host's literal (the procedure's
#: call has its ``alone`` flag after it).
_PID = re.compile(r"'\s*,\s*(\d+)\s*(?:,\s*\w+\s*\))?\s*$")


@dataclass(slots=True)
class SessionRun:
    """What a session's last grant through the procedure told it, which lets its later
    grants go without the procedure (``SESSION_GRANT``, ``SESSION_WAIT``,
    ``SESSION_TRY``): :attr:`Session.mysql_run`."""

    #: Added to a grant's ``UUID_SHORT()`` for its fencing token: ``(epoch << 44) - base``
    #: of the server's run (sql/mysql.sql), as the procedure adds it.
    token_base: int
    #: The server's clock minus this machine's at that grant (within a round trip): a
    #: grant without the procedure reads no server time, and reports this machine's
    #: time plus this.
    clock: timedelta
    #: What the session's slot-0 row says: its lock and holder. A grant of that lock by
    #: that holder writes no row (``SESSION_GRANT``). None: the session may have rows past
    #: slot 0 (that grant held beside others), so its next grant goes through the
    #: procedure, whose grant to a session that holds alone deletes them (else the slot-0
    #: row would name a lock that a row past it names too).
    row: tuple[str, str] | None
    #: The server is MariaDB, whose ``GET_LOCK`` waits fractions of a second (MySQL 8's
    #: whole seconds: a wait is rounded up).
    mariadb: bool


@functools.lru_cache(maxsize=4096)  # per grant: a SHA-256 once per name
def lock_name(database: str, key: str) -> str:
    """The named lock of storage key ``key`` in database ``database`` (``DATABASE()``):
    ``dl:s:`` and the first 32 hex digits of the SHA-256 of both, split by a NUL byte."""
    digest = hashlib.sha256(database.encode() + b"\0" + key.encode()).hexdigest()
    return "dl:s:" + digest[:32]


def _literals(statement: str) -> list[str]:
    """The string literals of a statement the driver wrote, unescaped."""
    return [re.sub(r"\\(.)", lambda m: _UNESCAPED.get(m[1], m[1]), text)
            for text in _LITERAL.findall(statement)]


class MySqlSessionBackend(SessionModeBackend, vendor="mysql"):
    """Session mode on MySQL and MariaDB: named locks (``GET_LOCK``), one round trip
    per acquire and per release, with fencing tokens, listing, waiters and force
    release (``KILL CONNECTION``)."""

    session_tag = "mysql"
    supports_force_release_by_owner = False
    why_unsupported = {
        **SessionModeBackend.why_unsupported,
        "supports_force_release_by_owner": "the server keeps no owner per grant (a named "
        "lock knows only its session; a second lock per grant would slow every acquire "
        "and release): force release frees the name whoever holds it, and the listing "
        "shows no owner id",
    }
    SERVER_PORT = "SELECT @@port"  # ProxySQL's multiplexing hands sessions round too
    DEFAULT_PORT = 3306

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        #: The database's settings, whose ``NAME`` is what ``DATABASE()`` returns on the
        #: backend's sessions: read at each use, not copied (Django's test runner renames
        #: the database in this very dict; a copy would name other locks than a process
        #: that reads it later).
        self._database_settings = connections[self.database].settings_dict

    def session_setup(self) -> list[tuple[str, list[Any] | None]]:
        """A new session: never idled out by the server; its holder rows kept out of the
        binary log where its user may say so; the lock that says it lives taken; the rows
        of sessions that are gone deleted (sql/mysql.sql, ``django_distlock_session_open``)."""
        return [(_NEVER_IDLE_OUT, None), (SESSION_OPEN, None)]

    def lock_name(self, key: str) -> str:
        """The named lock of storage key ``key`` (:func:`lock_name`)."""
        return lock_name(str(self._database_settings["NAME"]), key)

    def is_locked(self, name: str) -> bool:
        lock = self.lock_name(self.make_key(name))
        return bool(self.run(SESSION_IS_LOCKED, [lock], "checking a lock")[0][0])

    def _held_locks(self, prefix: str, limit: int, cursor: str | None) -> LockPage:
        low = self.key_prefix + prefix
        rows = self.run(SESSION_HELD, [cursor or "", low, upper_bound(low), limit],
                        "listing locks")
        infos = [self._info(row) for row in rows]
        return LockPage(infos, rows[-1][0] if len(rows) == limit else None)

    def _info(self, row: tuple[Any, ...]) -> LockInfo:
        """A held name's row: its holder's text (the owner is not kept: it would be a
        write per grant), since when its session is idle, host, process."""
        key, text, since, host, process, session, waiters = row
        return LockInfo(
            alias=self.alias, name=self.name_of(key), owner="", fencing_token=None,
            acquired_at=as_datetime(since), expires_at=None, host=host, pid=process,
            thread=read_holder(text) or f"{self.session_tag} {session}", waiters=waiters,
        )

    def _count_held(self, prefix: str, limit: int) -> HeldCount:
        low = self.key_prefix + prefix
        rows = self.run(SESSION_COUNT, [low, upper_bound(low), limit + 1], "counting locks")
        found = int(rows[0][0])
        return HeldCount(min(found, limit), found <= limit)

    def _waiters(self, key: str, limit: int) -> list[WaiterInfo]:
        rows = self.run(SESSION_WAITERS, [self.lock_name(key), limit], "listing waiters")
        waiters = []
        for position, (session, since, statement) in enumerate(rows, 1):
            # The procedure's call (lock, name, wait, label, host, pid, alone) or
            # SESSION_WAIT (lock, wait, label, host, pid): the label and host are the
            # strings after the name, or after the lock.
            texts = _literals(statement)
            at = 2 if statement.startswith("CALL") else 1
            label, host = (texts[at], texts[at + 1]) if len(texts) >= at + 2 else ("", "")
            pid = _PID.search(statement)
            owner, holder = read_label(label)
            waiters.append(WaiterInfo(
                position=position, owner=owner, since=as_datetime(since), host=host,
                pid=int(pid[1]) if pid else None, thread=holder, kind=Kind.EXCLUSIVE.value,
                session=f"{self.session_tag} {session}",
            ))
        return waiters

    def _force_release(self, key: str, owner: str) -> Freed | None:
        # owner is "": an owner was refused before (supports_force_release_by_owner).
        rows = self.run(SESSION_FORCE, [self.lock_name(key)], "force-releasing a lock")
        return Freed() if rows and rows[0][0] else None


class MySqlSessionAcquisition(SessionAcquisition):
    """One acquisition in session mode on MySQL or MariaDB: a try is the grant's call
    with no wait, a wait the same call with the time left; a release gives the named
    lock back and writes nothing (the holder's row stops counting)."""

    backend: MySqlSessionBackend

    def __init__(self, *args: Any) -> None:
        OwnSessionAcquisition.__init__(self, *args)  # not PostgreSQL's keys
        hold = self.hold
        # The backend's lock_name() written out: a frame fewer per acquire.
        self.lock = lock = lock_name(str(self.backend._database_settings["NAME"]), hold.key)
        #: The holder, as the session's row keeps it (the label without the owner).
        self.text = text = label_text(hold.holder_field)
        # holder_label() written out; the waiters' listing reads the owner id from it.
        self.label = f"dl {self.token[:SHORT_OWNER]} {text}"
        # The lock as an SQL literal: letters, digits and colons, quoted without escaping.
        self.quoted = f"'{lock}'".encode()
        self.fencing: int | None = None

    def _try(self, session: Session, wait: float = 0) -> tuple[int, datetime | None] | None:
        """The grant's statement, waiting up to ``wait`` seconds (a try: none): the token
        and server time, or None on a miss. A session that holds alone and knows its run
        (:class:`SessionRun`) sends ``SESSION_GRANT`` (a wait: ``SESSION_WAIT``) when its
        row names this lock and holder already, else (a try) ``SESSION_TRY``; else the
        procedure's call."""
        run = session.mysql_run
        if run is None or run.row is None or self.shared:
            return self._take(session, wait)
        if run.row != (self.lock, self.text):
            return self._take(session, wait) if wait else self._try_writing(session, run)
        conn = session.wrapper.connection
        if wait:
            literal = conn.string_literal
            seconds = wait if run.mariadb else math.ceil(wait)  # MySQL 8: whole seconds
            statement = SESSION_WAIT % (
                self.quoted, repr(seconds).encode(), literal(self.label.encode()),
                literal(_HOST.encode()), session.pid)
        else:
            statement = SESSION_GRANT % (self.quoted,)
        row = _query(conn, statement)
        drawn = None if row is None else row[0]
        if drawn is None:
            return None
        return run.token_base + drawn, datetime.now(UTC) + run.clock

    def _take(self, session: Session, wait: float) -> tuple[int, datetime | None] | None:
        """The procedure's call, which tells the session its run (:class:`SessionRun`)."""
        conn = session.wrapper.connection
        literal = conn.string_literal
        # The call written as MySQLdb's cursor writes it (the waiters' listing reads its
        # arguments back from the process list), without the cursor: see _query().
        row = _query(conn, SESSION_TAKE % (
            self.quoted, literal(self.hold.key.encode()), repr(wait).encode(),
            literal(self.label.encode()), literal(_HOST.encode()), session.pid,
            not self.shared))
        if row is None or row[0] is None:
            return None
        token, at, epoch, base = row
        at = at.replace(tzinfo=UTC)
        session.mysql_run = SessionRun(
            (epoch << 44) - base, at - datetime.now(UTC),
            None if self.shared else (self.lock, self.text),
            "MariaDB" in conn.get_server_info())
        return token, at

    def _try_writing(self, session: Session,
                     run: SessionRun) -> tuple[int, datetime | None] | None:
        """``SESSION_TRY``: a try that writes the session's row."""
        conn = session.wrapper.connection
        literal = conn.string_literal
        try:
            conn.query(SESSION_TRY % (
                self.quoted, literal(self.hold.key.encode()), literal(self.text.encode()),
                literal(_HOST.encode()), session.pid, self.quoted))
        except ERRORS as exc:
            if mysql_errno(exc) != 1114:
                raise
            # The table is full (the session's row was gone: deleted by hand): give the
            # lock back, and let the procedure say so, as it does.
            self._unlock(session, None)
            return self._take(session, 0)
        if not conn.affected_rows():
            return None
        run.row = (self.lock, self.text)
        return run.token_base + conn.insert_id(), datetime.now(UTC) + run.clock

    def _wait_row(self, session: Session, label: str) -> tuple[int, datetime | None] | None:
        # Each grant has its own row: this one's label, on a shared session too.
        return self._try(session, server_wait(self.deadline))

    def _unlock(self, session: Session, others: str | None) -> bool:
        # Also gives back a grant that a full table refused.
        row = _query(session.wrapper.connection, SESSION_UNLOCK % (self.quoted,))
        return bool(row and row[0] == 1)

    def _holds(self, session: Session) -> bool:
        row = session.execute(SESSION_HOLDS, [self.lock]).fetchone()
        return bool(row and row[0])


MySqlSessionBackend.kinds = {Kind.EXCLUSIVE: MySqlSessionAcquisition}


def _query(conn: Any, statement: bytes) -> tuple[Any, ...] | None:
    """Run ``statement`` on the MySQLdb connection ``conn`` (its arguments written in as
    literals) and return its first row (None: none), the result sets after it (a
    ``CALL``'s status) read: the grant's and the release's path, without the cursor's
    Python around the driver's call (some 15 µs of a pair).

    :raises MySQLdb.Error: as the cursor's ``execute`` would.
    """
    conn.query(statement)
    result = conn.store_result()
    rows = result.fetch_row() if result is not None else ()
    while conn.next_result() == 0:  # -1: no more
        conn.discard_result()
    return rows[0] if rows else None
