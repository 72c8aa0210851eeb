"""Session mode: a lock is the server's own session lock, held by a session of the
backend's (PostgreSQL: a two-key advisory lock; MySQL and MariaDB: a named lock,
``session_mysql.py``).

A grant writes nothing: one round trip takes the lock and draws its fencing token from
a sequence, as the raw advisory call would take the lock alone. The session that was
granted the lock is lent to that acquisition until its release (it holds that lock
alone, unless its thread waited for another while holding it: the wait runs there, so
that the server sees a cycle through the thread), so a release does not wait behind
another holder's statement, and the lock ends with the session: a holder that crashes
or whose connection is closed frees it as soon as the server sees the close
(docs/database.md, "Session mode").

Who holds comes from the server, with no write per grant: each session, when it opens,
records its client's host and process in ``django_distlock_session``; each grant (and
each wait) sets its session's ``application_name`` to ``dl <owner id> <thread and
context>`` (63 bytes at most); and the session stays idle until its release, so
``pg_stat_activity.state_change`` tells when it was granted. The name comes from the
lock table, where each process makes a name's row once, at its first acquire of it; a
listing joins ``pg_locks`` to the rows through an index on the key
(sql/postgresql.sql).
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from django.conf import settings
from django.core import checks
from django.db import connections

from ...exceptions import InvalidBackendOptions, LockLost
from ...kinds import Kind
from ...values import SHORT_OWNER, Grant, LockInfo, LockPage, Miss, WaiterInfo
from ..base import ExcInfo, Freed, HeldCount
from .backend import DatabaseBackend, server_wait
from .errors import ERRORS, is_deadlock, refused_wait
from .prepared import Prepared, fetch
from .session_acquisition import OwnSessionAcquisition, OwnSessionBackend
from .sessions import (
    CONTENDED_FOR,
    WATCHDOG_GRACE,
    Call,
    Session,
    SessionPool,
    note_contended,
)
from .sql import ENSURE_ROW, TABLE, as_datetime, upper_bound
from .transaction import KNOWN_ROWS

#: Idle sessions a backend keeps open for its next acquisitions (the rest are closed as
#: they come back).
KEEP_IDLE = 16

#: The server's TCP keepalives on each session (idle seconds, interval, count): a holder
#: whose machine vanished (no FIN: power lost, a partition) has its session, and its
#: locks, ended after about 5 + 3 x 1 = 8 s of silence, not after the OS default of
#: two hours. Over a Unix socket they do nothing (a dead client's socket closes).
KEEPALIVES = ("5", "1", "3")
PG_KEEPALIVES = (
    "SELECT set_config('tcp_keepalives_idle', %s, false),"
    " set_config('tcp_keepalives_interval', %s, false),"
    " set_config('tcp_keepalives_count', %s, false)")
#: Each session, when it opens: its client's host and process (sql/postgresql.sql).
PG_REGISTER = """
INSERT INTO django_distlock_session (pid, started, host, process)
SELECT pid, backend_start, %s, %s FROM pg_stat_activity WHERE pid = pg_backend_pid()
ON CONFLICT (pid) DO UPDATE SET started = excluded.started, host = excluded.host,
    process = excluded.process"""
#: Try: the grant's fencing token and server time (seconds since the epoch), or no row.
#: The session's application_name becomes the holder's label. Params: label, k1, k2.
#: ``date_part``, not ``extract``: since PostgreSQL 14 extract's epoch is a numeric, and
#: its arithmetic and cast to float8 cost about 3 µs a grant (``--placement same-core``).
PG_TRY = Prepared("session_try", """
SELECT t, date_part('epoch', clock_timestamp()) FROM (
    SELECT nextval('django_distlock_fencing') AS t, set_config('application_name', %s, false)
    WHERE pg_try_advisory_lock(%s::int4, %s::int4)) g""")
#: Wait in the server (sql/postgresql.sql). Params: k1, k2, seconds, label. Row: (token,
#: or NULL when the wait timed out; server time as the try's).
PG_WAIT = Prepared("session_wait", """
SELECT t, date_part('epoch', clock_timestamp())
FROM django_distlock_session_wait(%s::int4, %s::int4, %s::float8, %s) t""")
PG_UNLOCK = Prepared("session_unlock", "SELECT pg_advisory_unlock(%s::int4, %s::int4)")
#: The release of one of a session's grants while it holds others: the session's label
#: becomes that of the first of them. Params: k1, k2, label.
PG_UNLOCK_RELABEL = Prepared("session_unlock_relabel", """
SELECT pg_advisory_unlock(%s::int4, %s::int4), set_config('application_name', %s, false)""")
#: The two-key advisory locks of this database, as pg_locks shows them.
_LOCKS = """
SELECT (classid::bigint << 32) | objid::bigint AS k, pid, granted FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
#: Who a session is: its holder label, since when it is idle (holding: since the
#: grant; waiting: since its wait began), its client's host and process.
_WHO = """
JOIN pg_stat_activity a ON a.pid = h.pid
LEFT JOIN django_distlock_session s ON s.pid = h.pid AND s.started = a.backend_start"""
#: Whether this session holds the key (params: k1, k2 as unsigned).
PG_HOLDS = """
SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted
  AND pid = pg_backend_pid() AND classid = %s::oid AND objid = %s::oid"""
PG_IS_LOCKED = f"SELECT EXISTS (SELECT 1 FROM ({_LOCKS}) l WHERE granted AND k = %s)"
#: A page of held names. Params (named): after, low, high, limit. Rows: name, label,
#: since, host, process, server pid, waiters.
PG_HELD = f"""
WITH l AS MATERIALIZED ({_LOCKS})
SELECT r.name, a.application_name, a.state_change, s.host, s.process, h.pid,
    (SELECT count(*) FROM l w WHERE w.k = h.k AND NOT w.granted)
FROM l h
JOIN {TABLE} r ON django_distlock_session_key(r.name) = h.k{_WHO}
WHERE h.granted AND (r.name COLLATE "C") > %(after)s AND (r.name COLLATE "C") >= %(low)s
  AND (r.name COLLATE "C") < %(high)s
ORDER BY (r.name COLLATE "C") LIMIT %(limit)s"""
#: A key's waiters in arrival order. Params: key, limit. Rows: label, since, host,
#: process, server pid.
PG_WAITERS = f"""
SELECT a.application_name, a.query_start, s.host, s.process, h.pid FROM ({_LOCKS}) h{_WHO}
WHERE NOT h.granted AND h.k = %s ORDER BY a.query_start, h.pid LIMIT %s"""
#: End the holder's session (waiting up to 5 s for it to end), only while the holder's
#: short owner id is the one given ("": any). Params: key, owner, owner.
PG_TERMINATE = f"""
SELECT pg_terminate_backend(h.pid, 5000) FROM ({_LOCKS}) h{_WHO}
WHERE h.granted AND h.k = %s AND (%s = '' OR substr(a.application_name, 4, 8) = %s)"""

#: PostgreSQL keeps 63 bytes of an application_name, printable ASCII only.
_LABEL_BYTES = 63
#: ``dl <owner id> `` before the holder's text.
_LABEL_HEAD = len("dl  ") + SHORT_OWNER


def server_key(key: str) -> int:
    """The advisory-lock key of storage key ``key``: the first 8 bytes of its SHA-256, as
    a signed 64-bit int (``django_distlock_session_key`` in sql/postgresql.sql)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)


def server_keys(key: str) -> tuple[int, int]:
    """:func:`server_key` as the two int4 keys of ``pg_advisory_lock(k1, k2)``."""
    digest = hashlib.sha256(key.encode()).digest()
    return (int.from_bytes(digest[:4], "big", signed=True),
            int.from_bytes(digest[4:8], "big", signed=True))


def _server_time(seconds: bytes | None) -> datetime | None:
    """A server time sent as seconds since the epoch (``PG_TRY``'s), as an aware UTC
    datetime."""
    return None if seconds is None else datetime.fromtimestamp(float(seconds), UTC)


def holder_label(owner: str, holder: str) -> str:
    """A session's ``application_name`` for the holder (or waiter) ``owner`` (its short
    owner id, :data:`~django_distlock.values.SHORT_OWNER` characters) and ``holder`` (its
    thread label and context, ``Hold.holder_field``): ``dl <owner> <holder>``, the holder
    text escaped to printable ASCII and cut, with an ellipsis, to fit PostgreSQL's 63
    bytes."""
    return f"dl {owner} {label_text(holder)}"


@functools.lru_cache(maxsize=1024)  # per grant, and the same few threads and contexts
def label_text(holder: str) -> str:
    """The holder's part of :func:`holder_label`."""
    text = holder.encode("unicode_escape").decode("ascii")  # as _escaped(), one call less
    if _LABEL_HEAD + len(text) <= _LABEL_BYTES:
        return text
    room = _LABEL_BYTES - _LABEL_HEAD - len(_escaped("…"))
    kept, used = [], 0
    for char in holder:
        size = len(_escaped(char))
        if used + size > room:
            break
        kept.append(char)
        used += size
    return _escaped("".join(kept) + "…")


def _escaped(text: str) -> str:
    """``text`` as printable ASCII: a backslash, a control character or a non-ASCII one
    as Python's escape."""
    return text.encode("unicode_escape").decode("ascii")


def read_label(label: str) -> tuple[str, str]:
    """The short owner id and the holder text of a :func:`holder_label` (both "" for
    another application's)."""
    if not label.startswith("dl ") or label[11:12] != " ":
        return "", ""
    return label[3:11], read_holder(label[12:])


def read_holder(text: str) -> str:
    """The holder text of a label (:func:`label_text`), unescaped; an escape cut short at
    its end is dropped."""
    while text:
        try:
            return text.encode("ascii", "replace").decode("unicode_escape")
        except UnicodeDecodeError:
            text = text[: text.rfind("\\")]  # an escape cut short: drop it
    return ""


def _psycopg3() -> bool:
    """Whether Django's PostgreSQL backend runs on psycopg 3 (it prefers it to psycopg2)."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3


class _Holding(threading.local):
    session: Session | None = None


class SessionModeBackend(OwnSessionBackend, mode="session"):
    """The database backend's session mode (``OPTIONS["MODE"] = "session"``), on
    PostgreSQL: session-level advisory locks, one round trip per acquire and per
    release, with fencing tokens, listing, waiters and force release (MySQL and
    MariaDB: :class:`~.session_mysql.MySqlSessionBackend`, from :meth:`for_vendor`)."""

    #: A vendor → the subclass that serves session mode there (filled by the subclasses).
    vendors: ClassVar[dict[str, type[SessionModeBackend]]] = {}
    #: How the listing names a server session without a label ("pg <pid>").
    session_tag = "pg"
    #: The port the server's session was accepted on (NULL over a Unix socket), and the
    #: vendor's default port (the check of a proxy in between).
    SERVER_PORT = "SELECT inet_server_port()"
    DEFAULT_PORT = 5432

    supports_listing = True
    supports_counting = True
    supports_force_release = True
    supports_force_release_by_owner = True
    supports_waiters = True
    why_unsupported = {
        "supports_expiry": "a session-mode lock is held until it is released or its "
        "session ends (a crashed holder's connection closing frees it); it has no lease",
        "supports_age_order": "a session-mode grant writes nothing: the listing reads the "
        "server's lock table, which has no order by age",
        "supports_shared_owner": "a session-mode lock belongs to the one session that "
        "was granted it",
        "supports_leadership": "a leader cut off from the server could not learn in time "
        "that the server ended its session (TCP keepalives, or a kill) and granted the "
        "name to another: a session lock has no lease to count down (use MODE 'lease')",
    }

    def __init_subclass__(cls, vendor: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if vendor:
            SessionModeBackend.vendors[vendor] = cls

    @classmethod
    def for_vendor(cls, vendor: str) -> type[DatabaseBackend]:
        return cls.vendors.get(vendor, cls)

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        if self.vendor not in ("postgresql", *self.vendors):
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['MODE'] = 'session' takes the server's own "
                f"session locks, which PostgreSQL, MySQL and MariaDB have; "
                f"DATABASES[{self.database!r}] is {self.vendor_name}. Use MODE 'lease' or "
                f"'transaction' there."
            )
        if self.vendor == "postgresql" and not _psycopg3():
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['MODE'] = 'session' on PostgreSQL runs its "
                "statements through psycopg 3's libpq connection; Django uses psycopg2 here. "
                "Install psycopg 3 (`pip install psycopg[binary]`): Django then uses it."
            )
        self.session_factory.setup = self.session_setup
        self.pool = SessionPool(self.session_factory, KEEP_IDLE)
        #: Keys whose row this process has made (or found), the listing's names, each
        #: with its server keys as libpq takes them (SHA-256 once per name, not per grant).
        self.rows: dict[str, tuple[bytes, bytes]] = {}
        #: Keys recently waited for, and when (monotonic): a blocking acquire of one goes
        #: straight to the server's queue (one round trip, not a miss and then the wait).
        self.contended: dict[str, float] = {}
        #: The grants each threads' session holds: session → (the thread's ident, {key:
        #: the grant's label}, in grant order). A thread's blocking wait runs on the
        #: session of a lock it holds, so that the server sees a cycle through it.
        self.grants: dict[Session, tuple[int, dict[str, str]]] = {}
        #: This thread's session that holds its first live grant, if any.
        self.holding = _Holding()

    def session_setup(self) -> list[tuple[str, list[Any] | None]]:
        """The statements that set a new session up (``SessionFactory.setup``): its TCP
        keepalives, then the record of its client."""
        return [(PG_KEEPALIVES, list(KEEPALIVES)),
                (PG_REGISTER, [socket.gethostname(), os.getpid()])]

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages = super().check(**kwargs)
        if kwargs.get("deploy") and self.database in settings.DATABASES:
            messages.extend(self._proxy_check())
        return messages

    def _proxy_check(self) -> list[checks.CheckMessage]:
        """``check --deploy``: whether something between Django and the server forwards the
        connections (the port the server accepted them on is not the one configured): a
        pooler in transaction mode (PgBouncer's ``pool_mode = transaction``, ProxySQL's
        multiplexing) hands a session, and its locks, to another client between
        statements. One round trip; nothing to say over a Unix socket."""
        configured = connections[self.database].settings_dict
        host, port = str(configured.get("HOST") or ""), str(configured.get("PORT") or "")
        if not host or host.startswith("/"):
            return []  # a Unix socket: no TCP proxy in between
        try:
            (found,) = self.run(self.SERVER_PORT, [], "checking the server")[0]
        except Exception as exc:  # reported, never raised: a check must not crash
            return [checks.Warning(
                f"DISTLOCK[{self.alias!r}]: could not ask the server which port it accepted "
                f"the session on: {exc}", obj=self.alias, id="distlock.W054")]
        expected = int(port) if port.isdigit() else self.DEFAULT_PORT
        if found is None or int(found) == expected:
            return []
        return [checks.Warning(
            f"DISTLOCK[{self.alias!r}]: session mode connects to port {expected}, and the "
            f"server accepted the session on port {found}: something forwards the "
            "connections. A pooler in transaction mode (PgBouncer's pool_mode = transaction, "
            "ProxySQL's multiplexing) gives a session, and the locks it holds, to another "
            "client between statements.",
            hint=f"Point DATABASES[{self.database!r}] at the server, or at a pooler in "
            "session mode (docs/database.md, session mode, \"Poolers\").",
            obj=self.alias, id="distlock.W063")]

    def note_row(self, key: str) -> tuple[bytes, bytes]:
        """Remember that ``key``'s row exists (at most ``KNOWN_ROWS`` keys: past that, the
        next acquire of each makes sure of it again); return its server keys as text."""
        if len(self.rows) >= KNOWN_ROWS:
            self.rows.clear()
        k1, k2 = server_keys(key)
        keys = self.rows[key] = (str(k1).encode(), str(k2).encode())
        return keys

    def is_locked(self, name: str) -> bool:
        key = server_key(self.make_key(name))
        return bool(self.run(PG_IS_LOCKED, [key], "checking a lock")[0][0])

    def _held_locks(self, prefix: str, limit: int, cursor: str | None) -> LockPage:
        low = self.key_prefix + prefix
        params = {"after": cursor or "", "low": low, "high": upper_bound(low), "limit": limit}
        rows = self.run(PG_HELD, params, "listing locks")
        infos = [self._info(row) for row in rows]
        return LockPage(infos, rows[-1][0] if len(rows) == limit else None)

    def _info(self, row: tuple[Any, ...]) -> LockInfo:
        key, label, since, host, process, session, waiters = row
        owner, holder = read_label(label or "")
        return LockInfo(
            alias=self.alias, name=self.name_of(key), owner=owner, fencing_token=None,
            acquired_at=as_datetime(since), expires_at=None, host=host or "", pid=process,
            thread=holder or f"{self.session_tag} {session}", waiters=waiters,
        )

    def _count_held(self, prefix: str, limit: int) -> HeldCount:
        low = self.key_prefix + prefix
        params = {"after": "", "low": low, "high": upper_bound(low), "limit": limit + 1}
        rows = self.run(f"SELECT count(*) FROM ({PG_HELD}) AS counted", params,
                        "counting locks")
        found = int(rows[0][0])
        return HeldCount(min(found, limit), found <= limit)

    def _waiters(self, key: str, limit: int) -> list[WaiterInfo]:
        rows = self.run(PG_WAITERS, [server_key(key), limit], "listing waiters")
        waiters = []
        for position, (label, since, host, process, session) in enumerate(rows, 1):
            owner, holder = read_label(label or "")
            waiters.append(WaiterInfo(
                position=position, owner=owner, since=as_datetime(since), host=host or "",
                pid=process, thread=holder, kind=Kind.EXCLUSIVE.value,
                session=f"{self.session_tag} {session}",
            ))
        return waiters

    def _force_release(self, key: str, owner: str) -> Freed | None:
        rows = self.run(PG_TERMINATE, [server_key(key), owner, owner],
                        "force-releasing a lock")
        return Freed() if any(ended for ended, in rows) else None

    def close(self) -> None:
        self.pool.close()
        self.grants.clear()  # their sessions are closed below, and the grants with them
        super().close()


class SessionAcquisition(OwnSessionAcquisition):
    """One acquisition in session mode (on PostgreSQL; :meth:`_try`, :meth:`_wait_call`,
    :meth:`_unlock` and :meth:`_holds` are the vendor's statements): the session it
    takes (a thread's from the backend's :class:`SessionPool`, a task's from its async
    pool) holds the lock from the grant to the release.

    A thread's blocking wait runs on the session of a lock the thread already holds (one
    of this backend's), so that PostgreSQL sees a cycle of waits through it and refuses
    one (``Deadlock``); a grant that comes there shares that session, which goes back to
    the pool when its last grant is released.
    """

    backend: SessionModeBackend
    #: The session is one that holds another grant of this thread (see the class).
    shared = False
    #: The name's server keys as text (None until its row is known to exist).
    keys: tuple[bytes, bytes] | None = None

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        hold = self.hold
        self.keys = self.backend.rows.get(hold.key)
        # holder_label() written out: a call fewer per grant.
        self.label = f"dl {self.token[:SHORT_OWNER]} {label_text(hold.holder_field)}"
        self.fencing: int | None = None

    # -- the session: this acquisition's own, or shared with the thread's grants -----

    def _session(self, bound: float | None = None) -> Session:
        taken = self.taken
        if taken is not None and taken.usable:
            return taken
        if self.loop is not None:  # a task's, from the async pool: reopened there
            return super()._session(bound)
        if taken is not None:  # lost before the grant: another one
            self.backend.grants.pop(taken, None)
            taken.close()
            self.shared = False
            # What ended it (a restart, every session terminated) may have ended the idle
            # ones too: none of them is tried (the next one comes new).
            self.backend.pool.close()
        try:
            taken = self.taken = self.backend.pool.take(bound)
        except ERRORS as exc:
            raise self.backend.errors.translate(exc, "connecting", self.backend.where) from exc
        return taken

    def _holding_session(self) -> Session | None:
        """This thread's session that holds another of its grants, idle, and not of this
        key (it would be granted again there, counted); None if none."""
        session = self.backend.holding.session
        if session is None or not session.usable or session.mutex.locked():
            return None
        held = self.backend.grants.get(session)
        if held is None or held[0] != threading.get_ident() or self.hold.key in held[1]:
            return None
        return session

    def _give_back(self) -> None:
        if self.loop is not None:
            super()._give_back()
            return
        taken, self.taken = self.taken, None
        if taken is not None and not self.shared:
            self.backend.pool.give_back(taken)

    def close(self) -> None:
        self._give_back()  # it holds nothing (or others' grants): not this one's

    def _granted(self, session: Session, token: int, at: datetime | None) -> Grant:
        """Record a grant on ``session`` (a thread's: in the backend's table of grants)."""
        self.fencing = token
        if self.loop is None:
            backend = self.backend
            held = backend.grants.get(session)
            if held is None:
                ident = threading.get_ident()
                backend.grants[session] = (ident, {self.hold.key: self.label})
                holding = backend.holding.session
                first = None if holding is None else backend.grants.get(holding)
                if first is None or first[0] != ident:  # none, or stale: this one
                    backend.holding.session = session
            else:
                held[1][self.hold.key] = self.label
        return Grant(token, at, None)

    # -- the calls -----------------------------------------------------------------

    def _attempt_on(self, session: Session) -> Grant | Miss:
        hold, backend = self.hold, self.backend
        key = hold.key
        if self.blocking:
            seen = backend.contended.get(key)
            if seen is not None and time.monotonic() - seen < CONTENDED_FOR:
                return Miss()  # known contended: the wait queues (and grants if free)
        deadline = self.deadline
        try:
            with session.mutex:
                # The watchdog's bound written out (not self._watched(): a generator's
                # context manager costs more than the rest of this method).
                if deadline is not None:
                    session.until = deadline + WATCHDOG_GRACE
                try:
                    row = self._try(session)
                finally:
                    session.until = None
        except ERRORS as exc:
            self._drop(session)
            raise backend.errors.translate(exc, "acquiring a lock", backend.where) from exc
        if row is None:
            return Miss()
        return self._granted(session, row[0], row[1])

    def _server_keys(self, session: Session) -> tuple[bytes, bytes]:
        """The name's server keys, making its row first if this process has not yet
        (``session.mutex`` held): for the listing, once per process and name (its own
        round trip, the first time only)."""
        keys = self.keys
        if keys is None:
            key = self.hold.key
            session.execute(ENSURE_ROW, [key])
            keys = self.keys = self.backend.note_row(key)
        return keys

    def _try(self, session: Session) -> tuple[int, datetime | None] | None:
        """The try's statement (``session.mutex`` held): the grant's token and server
        time, or None on a miss."""
        k1, k2 = self.keys or self._server_keys(session)
        row = fetch(session.pgconn, session.prepared, PG_TRY, [self.label.encode(), k1, k2])
        if row is None:
            return None
        # A row only when granted, its token from nextval(): never NULL; its time as
        # _server_time() reads it, written out (one call fewer on the hot path).
        token, at = row
        return int(token), None if at is None else datetime.fromtimestamp(float(at), UTC)  # type: ignore[arg-type]

    def _wait_row(self, session: Session, label: str) -> tuple[int, datetime | None] | None:
        """The wait's statement (``session.mutex`` held; ``label``: the session's label
        while it waits): the try's result, None when the wait timed out."""
        k1, k2 = self._server_keys(session)
        seconds = repr(server_wait(self.deadline)).encode()
        row = fetch(session.pgconn, session.prepared, PG_WAIT, [k1, k2, seconds, label.encode()])
        if row is None or (token := row[0]) is None:
            return None
        return int(token), _server_time(row[1])

    def _unlock(self, session: Session, others: str | None) -> bool:
        """The release's statement (``session.mutex`` held; ``others``: the label of the
        session's other grants, if it keeps any): whether the lock was held."""
        k1, k2 = self.keys or self._server_keys(session)
        if others is None:
            row = fetch(session.pgconn, session.prepared, PG_UNLOCK, [k1, k2])
        else:
            row = fetch(session.pgconn, session.prepared, PG_UNLOCK_RELABEL,
                        [k1, k2, others.encode()])
        return row is not None and row[0] == b"t"

    def _holds(self, session: Session) -> bool:
        """Whether ``session`` holds this lock (``session.mutex`` held)."""
        k1, k2 = self._server_keys(session)
        return session.execute(
            PG_HOLDS, [int(k1) & 0xFFFFFFFF, int(k2) & 0xFFFFFFFF]).fetchone() is not None

    def wait(self, miss: Miss) -> Grant | None:
        if not self.shared:
            shared = self._holding_session()
            if shared is not None:  # wait where the server sees this thread's other locks
                self._give_back()  # the try's session holds nothing
                self.taken, self.shared = shared, True
        return super().wait(miss)

    def _wait_on(self, session: Session, call: Call) -> Grant | None:
        hold, backend = self.hold, self.backend
        note_contended(backend.contended, hold.key)
        label = self.label
        if self.shared:  # the session keeps the label of the first grant it holds
            held = backend.grants.get(session)
            label = next(iter(held[1].values())) if held else label
        try:
            with session.mutex, self._watched(session), call.running_on(session):
                row = self._wait_row(session, label)
        except ERRORS as exc:
            if is_deadlock(exc):  # the session is fine: the statement alone failed
                raise refused_wait(backend.where, hold.name, backend.alias, exc) from exc
            self._drop(session)
            if call.cancelled:
                return None
            raise backend.errors.translate(exc, "waiting for a lock", backend.where) from exc
        if row is None:
            return None
        return self._granted(session, row[0], row[1])

    def _drop(self, session: Session) -> None:
        self.backend.grants.pop(session, None)  # its grants end with it
        super()._drop(session)

    def release(self, exc_info: ExcInfo) -> bool:
        session, backend = self.taken, self.backend
        if session is None or not session.usable:
            self._give_back()
            return False  # its session is gone, and the lock went with it
        held = backend.grants.get(session)
        others = None
        if held is not None:
            held[1].pop(self.hold.key, None)
            if held[1]:  # the session stays with the thread's other grants
                others = next(iter(held[1].values()))
                self.shared = True
            else:
                del backend.grants[session]
                self.shared = False
        try:
            with session.mutex:
                session.until = time.monotonic() + WATCHDOG_GRACE  # as in _attempt_on
                try:
                    held_until_now = self._unlock(session, others)
                finally:
                    session.until = None
        except ERRORS as exc:
            # The session is closed: the server frees the lock (and any other it held)
            # with it, at once or when it sees the close. Whether it was held until now
            # is unknown: lost.
            self._drop(session)
            self._give_back()
            raise LockLost(
                f"{backend.where}: the session holding {self.hold.name!r} failed at its "
                f"release ({exc}); the lock ended with it.") from exc
        self._give_back()
        return held_until_now

    def extend(self, ttl: float) -> Grant | None:
        """The lock does not expire: check that our session still holds it (one round
        trip)."""
        session = self.taken
        if session is None or not session.usable:
            return None
        try:
            with session.mutex, self._watched(session, time.monotonic()):
                holds = self._holds(session)
        except ERRORS:
            self._drop(session)
            return None
        if not holds:
            return None
        return Grant(self.fencing, self.hold.acquired_at, None)


SessionModeBackend.kinds = {Kind.EXCLUSIVE: SessionAcquisition}
