"""Session mode on PostgreSQL (``backends/database/session_mode.py``) and on MariaDB
(``session_mysql.py``): the contract, and what session locks add: the name's key, a
grant on its own session, the listing from the server and the holder's label, deadlocks
found by the server (force release, by ending the holder's session, is the contract's)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from django_distlock import holder_context, locks
from django_distlock.backends.database import DatabaseBackend
from django_distlock.backends.database.errors import mysql_errno, sqlstate
from django_distlock.backends.database.session_mode import (
    holder_label,
    read_label,
    server_key,
)
from django_distlock.backends.database.session_mysql import lock_name
from django_distlock.exceptions import (
    Deadlock,
    DistLockError,
    InvalidBackendOptions,
    SelfDeadlock,
)
from django_distlock.testing import LockContract

from .conftest import LIBRARY_DB, eventually, in_thread, require_mysql, require_pg
from .figures import record
from .forwarder import Forwarder
from .test_backend_database import PostgresContract
from .test_hostile import _free_now

_DB = "django_distlock.backends.database.DatabaseBackend"
#: Session mode's aliases, each run where its server is.
ALIASES = ["pg-session", "mysql-session"]

pytestmark = [pytest.mark.second_env, LIBRARY_DB]


class TestPostgresSession(PostgresContract):
    alias = "pg-session"


class TestMySqlSession(LockContract):
    alias = "mysql-session"

    @pytest.fixture(autouse=True)
    def _mysql(self) -> None:
        require_mysql()


# -- what session locks add -------------------------------------------------------


def _require(alias: str) -> None:
    (require_pg if alias.startswith("pg") else require_mysql)()


def test_sqlite_is_refused_at_construction(settings) -> None:
    """SQLite has no session locks: its alias is refused before any I/O, saying what to
    use instead."""
    settings.DISTLOCK = {"s": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default",
                                                           "MODE": "session"}}}
    with pytest.raises(InvalidBackendOptions, match=r"MySQL and MariaDB have; .* is SQLite"):
        locks["s"]


def test_the_key_is_the_servers_for_any_name(unique) -> None:
    """The client's key of a name is the server's (the listing joins on it): names with
    non-ASCII text, a NUL-free control-free 255-character one, a shortened long one."""
    require_pg()
    backend = locks["pg-session"]
    keys = [backend.make_key(name) for name in (
        unique("k"), "é/ü/文字/🔒", "x" * 255, "long/" + "y" * 5000, "a'b\\c")]
    rows = backend.run("SELECT django_distlock_session_key(k) FROM unnest(%s::text[]) k",
                       [keys], "reading keys")
    assert [row[0] for row in rows] == [server_key(key) for key in keys]
    assert len({server_key(key) for key in keys}) == len(keys)


def test_the_named_lock_is_the_servers_for_any_name(unique) -> None:
    """MariaDB: the client's named lock of a name is the server's SHA-256 of
    ``DATABASE()`` and the name's UTF-8 (as the docs state it), distinct for distinct
    names, within the 64 characters a named lock may have."""
    require_mysql()
    backend = locks["mysql-session"]
    keys = [backend.make_key(name) for name in (
        unique("k"), "é/ü/文字/🔒", "x" * 255, "long/" + "y" * 5000, "a'b\\c")]
    found = [backend.run(
        "SELECT CONCAT('dl:s:', LEFT(SHA2(CONCAT(CONVERT(DATABASE() USING utf8mb4), 0x00,"
        " CONVERT(%s USING utf8mb4)), 256), 32))", [key], "reading keys")[0][0] for key in keys]
    assert found == [backend.lock_name(key) for key in keys]
    assert len(set(found)) == len(keys) and all(len(lock) == 37 for lock in found)


def test_the_named_lock_follows_the_database_renamed_in_place() -> None:
    """Django's test runner renames the database in the settings' dict in place: a backend
    built before it must name its locks by the database its sessions use then, as a
    process that starts later does (a name copied at construction excluded nobody)."""
    require_mysql()
    backend = locks["mysql-session"]
    settings_dict = connections["mysql"].settings_dict
    name = settings_dict["NAME"]
    settings_dict["NAME"] = "renamed_in_place"
    try:
        renamed = backend.lock_name("s:key")
    finally:
        settings_dict["NAME"] = name
    assert renamed == lock_name("renamed_in_place", "s:key") != backend.lock_name("s:key")


@pytest.mark.parametrize("alias", ALIASES)
def test_one_thread_holds_a_name_once(alias: str, unique) -> None:
    """Both servers count a session's re-acquires of its lock; each grant here has a
    session of its own, so a second handle of the holder's thread misses (or, blocking,
    raises SelfDeadlock at once), and the name is free after the first's release."""
    _require(alias)
    backend, name = locks[alias], unique("once")
    first = backend.lock(name)
    assert first.acquire()
    second = backend.lock(name)
    assert not second.acquire(blocking=False)
    with pytest.raises(SelfDeadlock):
        second.acquire(timeout=5)
    assert not in_thread(lambda: backend.lock(name).acquire(timeout=0.2))
    first.release()
    assert not backend.is_locked(name)
    assert in_thread(lambda: _free_now(backend, name))


def _held_in_thread(backend: Any, name: str) -> threading.Event:
    """Hold ``name`` in a thread of its own until the returned event is set."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        handle = backend.lock(name)
        assert handle.acquire()
        taken.set()
        done.wait(30)
        handle.release()

    threading.Thread(target=hold, daemon=True).start()
    assert taken.wait(10)
    return done


@pytest.mark.parametrize("alias", ALIASES)
def test_a_listing_shows_each_holder_and_waiter_from_the_server(alias: str, unique) -> None:
    """Who holds and who waits, as the server shows them: host and process (PostgreSQL:
    recorded by the session once; MySQL: in the session's row), owner id (PostgreSQL
    only: on MySQL it would be a write per grant) and thread (its label), since when
    (the holder session's idle time); the waiter in the holder's row count and in
    ``waiters()``, with its owner id (MySQL: its call in the process list); fencing
    tokens are not listed."""
    _require(alias)
    backend, name = locks[alias], unique("who")
    holder = backend.lock(name)
    assert holder.acquire()
    waiting = threading.Event()

    def wait() -> bool:
        waiting.set()
        handle = backend.lock(name, timeout=10)
        if not handle.acquire():
            return False
        handle.release()
        return True

    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(wait()), name="the-waiter")
    thread.start()
    try:
        assert eventually(lambda: backend.waiters(name), 5)
        (info,) = backend.held_locks(prefix=name)
        (waiter,) = backend.waiters(name)
    finally:
        holder.release()
        thread.join(15)
    assert done == [True]
    owner = holder.owner_id if alias.startswith("pg") else ""
    assert (info.name, info.owner, info.host, info.pid, info.thread) == (
        name, owner, holder.holder.host, os.getpid(), holder.holder.thread)
    assert info.fencing_token is None and info.expires_at is None and info.waiters == 1
    assert info.acquired_at is not None
    assert abs((info.acquired_at - holder.acquired_at).total_seconds()) < 1
    assert (waiter.position, waiter.host, waiter.pid, waiter.thread, waiter.kind) == (
        1, holder.holder.host, os.getpid(), "the-waiter", "exclusive")
    assert waiter.session.startswith(alias.split("-")[0] + " ") and len(waiter.owner) == 8
    assert waiter.owner != holder.owner_id


@pytest.mark.parametrize("holder", [
    "MainThread", "MainThread\x1fGET /orders/7/pay", "t\\x\x1f" + "é" * 100,
    "a" * 300, "\x1f", "x\\", "Thread-2 (run)/Task-7\x1fcélery.task"])
def test_a_holder_label_keeps_what_fits_in_63_bytes(holder: str) -> None:
    """The holder text survives PostgreSQL's printable-ASCII ``application_name``: escaped,
    cut whole characters at a time with an ellipsis, read back as it was."""
    label = holder_label("0123abcd", holder)
    assert len(label) <= 63 and label.isascii() and label.isprintable()
    owner, text = read_label(label)
    assert owner == "0123abcd"
    assert text == holder or (text.endswith("…") and holder.startswith(text[:-1]))


@pytest.mark.parametrize("alias", ALIASES)
def test_crossed_waits_raise_deadlock_and_the_other_wait_goes_on(alias: str, unique) -> None:
    """Two threads each holding one name and waiting for the other's: a thread's wait
    runs on the session of the lock it holds, so the server sees the cycle and refuses
    one wait (PostgreSQL 40P01, MariaDB 1213: inside a procedure, which a stored
    function's wait would not be) as the typed Deadlock, chained to its error; that
    thread releases what it holds, and the other wait is granted."""
    _require(alias)
    backend = locks[alias]
    a_name, b_name = unique("a"), unique("b")
    a_held = threading.Event()
    outcome: list[object] = []

    def other_thread() -> None:
        a = backend.lock(a_name)
        assert a.acquire()
        a_held.set()
        try:
            wanted = backend.lock(b_name, timeout=20)
            outcome.append(wanted.acquire())
            wanted.release()
        except Deadlock as exc:
            outcome.append(exc)
        finally:
            a.release()

    b = backend.lock(b_name)
    assert b.acquire()
    thread = threading.Thread(target=other_thread)
    thread.start()
    refused: object = None
    try:
        assert a_held.wait(5) and eventually(lambda: backend.waiters(b_name), 5)
        started = time.monotonic()
        wanted = backend.lock(a_name, timeout=20)
        try:
            assert wanted.acquire()
            wanted.release()
        except Deadlock as exc:
            refused = exc
        elapsed = time.monotonic() - started
    finally:
        b.release()
        thread.join(25)
    deadlocks = [x for x in (refused, *outcome) if isinstance(x, Deadlock)]
    assert len(deadlocks) == 1, (refused, outcome)  # one wait refused, the other granted
    assert outcome == ([True] if refused else deadlocks)
    error = deadlocks[0]
    assert error.alias == alias and error.name in (a_name, b_name)
    if alias.startswith("pg"):
        assert sqlstate(error.__cause__) == "40P01"
    else:
        assert mysql_errno(error.__cause__) == 1213
    assert elapsed < 15  # found by the server (PostgreSQL: deadlock_timeout, 1 s), not
    # the 20 s timeouts


def _waited_beside(backend: Any, outer_name: str, inner_name: str,
                   release: Any) -> tuple[Any, Any]:
    """Hold ``outer_name``, then wait for ``inner_name`` (held by a blocker that
    ``release()``, called 0.5 s later, lets go): both handles, the inner one granted on
    the outer one's session."""
    outer = backend.lock(outer_name)
    assert outer.acquire()
    inner = backend.lock(inner_name, timeout=10)
    releasing = threading.Timer(0.5, release)
    releasing.start()
    assert inner.acquire()
    releasing.join()
    assert inner._hold.acquisition.taken is outer._hold.acquisition.taken
    return outer, inner


@pytest.mark.parametrize("alias", ALIASES)
def test_a_lock_waited_for_by_a_holder_shares_its_session_until_both_are_released(
    alias: str, unique,
) -> None:
    """A thread holding one name that waits for another waits (and is granted) on the
    first one's session: PostgreSQL's listing shows both under the first grant's label
    (a session has one), MySQL's each under its own row (without owner ids); releasing
    the first leaves the second listed as its own, and the session goes back to the pool
    only when both are released."""
    _require(alias)
    backend = locks[alias]
    outer_name, inner_name = unique("outer"), unique("inner")
    blocker = in_thread(lambda: _held_in_thread(backend, inner_name))
    outer, inner = _waited_beside(backend, outer_name, inner_name, blocker.set)
    try:
        listed = {info.name: info.owner for name in (outer_name, inner_name)
                  for info in backend.held_locks(prefix=name)}
        pg = alias.startswith("pg")
        assert listed == ({outer_name: outer.owner_id, inner_name: outer.owner_id} if pg
                          else {outer_name: "", inner_name: ""})
        outer.release()
        (info,) = backend.held_locks(prefix=inner_name)
        assert info.owner == (inner.owner_id if pg else "")
        assert backend.is_locked(inner_name) and not backend.is_locked(outer_name)
    finally:
        inner.release()
    assert not backend.grants


def test_a_session_has_the_servers_keepalives_and_records_its_client() -> None:
    """The server ends a silent holder's session (and its locks) after about 8 s, not
    the OS' two hours: each session sets its TCP keepalives; and its client's host and
    process are recorded once, at its opening."""
    require_pg()
    backend = locks["pg-session"]
    session = backend.pool.take()
    try:
        with session.mutex:
            session.cursor.execute(
                "SELECT current_setting('tcp_keepalives_idle'),"
                " current_setting('tcp_keepalives_interval'),"
                " current_setting('tcp_keepalives_count'), s.host, s.process"
                " FROM django_distlock_session s WHERE s.pid = pg_backend_pid()")
            row = session.cursor.fetchone()
    finally:
        backend.pool.give_back(session)
    assert row == ("5", "1", "3", socket.gethostname(), os.getpid())


def test_a_mysql_session_is_never_idled_out_and_new_ones_sweep_the_rows_of_sessions_gone(
    unique,
) -> None:
    """MariaDB: a holder may sit idle past the server's ``wait_timeout`` (each session
    sets its own to the most there is); a release writes nothing, so its row stays,
    also when a new session opens (the released session lives: its next grant of the
    name writes no row), until its session is gone: then a new session deletes it (the
    held one stays)."""
    require_mysql()
    backend = locks["mysql-session"]
    # The thread's own session (backend.run's), opened now: its opening sweeps.
    backend.run("SELECT 1", [], "opening")
    released, held = backend.lock(unique("released")), backend.lock(unique("held"))
    assert released.acquire() and held.acquire()
    gone = released._hold.acquisition.taken
    released.release()
    count = "SELECT count(*) FROM django_distlock_session_grant WHERE name = %s"

    def sweep() -> Any:
        session = backend.session_factory.open()  # its opening sweeps
        try:
            with session.mutex:
                return session.execute("SELECT @@SESSION.wait_timeout", None).fetchone()
        finally:
            session.close()

    try:
        assert backend.run(count, [backend.make_key(released.name)], "reading")[0][0] == 1
        assert sweep() == (31536000,)
        assert backend.run(count, [backend.make_key(released.name)], "reading")[0][0] == 1
        backend.pool.close()  # the released lock's session among the idle ones
        assert gone.closed
        # The server frees a closed session's named locks when it sees the close.
        alive = "SELECT IS_USED_LOCK(CONCAT('dl:c:', %s)) IS NOT NULL"
        assert eventually(
            lambda: not backend.run(alive, [gone._thread_id], "reading")[0][0], 5)
        sweep()
        assert backend.run(count, [backend.make_key(released.name)], "reading")[0][0] == 0
        assert backend.run(count, [backend.make_key(held.name)], "reading")[0][0] == 1
        assert [info.name for info in backend.held_locks(prefix=held.name)] == [held.name]
    finally:
        held.release()


def test_a_grant_deletes_its_sessions_older_rows_by_the_key_not_by_a_scan() -> None:
    """MariaDB: a session's grant through the procedure, when the session holds nothing
    else, deletes its rows past slot 0 (``WHERE session = CONNECTION_ID() AND slot > 0``,
    sql/mysql.sql) through the table's key, not by reading every open session's rows: the
    key was once a hash, which cannot serve a range, and each grant scanned the table
    (measured: a pair 272 µs with one row, 362 µs with a thousand)."""
    require_mysql()
    backend = locks["mysql-session"]
    rows = [(4_000_000_000 + n // 2, n % 2, f"dl:s:test-scan-{n}") for n in range(50)]
    backend.run(
        "INSERT INTO django_distlock_session_grant"
        " (session, slot, lk, name, label, host, pid) VALUES "
        + ", ".join(["(%s, %s, %s, 'n', 'l', 'h', 1)"] * len(rows)),
        [value for row in rows for value in row], "writing")
    try:
        # The procedure's statement, for a session with rows (its own id has none: the
        # optimizer would then read no table at all).
        ((_, _, _, access, _, key, *_),) = backend.run(
            "EXPLAIN DELETE FROM django_distlock_session_grant WHERE session = %s AND slot > 0",
            [rows[10][0]], "explaining")
        assert (access, key) == ("range", "PRIMARY")  # a scan reads "ALL" and no key
    finally:
        backend.run("DELETE FROM django_distlock_session_grant WHERE session >= %s",
                    [4_000_000_000], "cleaning")


def _session_rows(backend: Any, session: Any) -> list[tuple[int, str]]:
    """MariaDB: the grants' table's rows of the backend's ``session``: (slot, name)."""
    return [tuple(row) for row in backend.run(
        "SELECT slot, name FROM django_distlock_session_grant WHERE session = %s"
        " ORDER BY slot", [session._thread_id], "reading")]


def _statements(session: Any) -> dict[str, int]:
    """MariaDB: the backend's ``session``'s counts of the statements that write a
    holder's row: procedure calls, ``INSERT ... SELECT``, ``REPLACE``, ``INSERT``."""
    with session.mutex:
        return {name: int(value) for name, value in session.execute(
            "SHOW SESSION STATUS WHERE Variable_name IN ('Com_call_procedure',"
            " 'Com_insert_select', 'Com_replace', 'Com_insert')", None).fetchall()}


def test_a_mysql_sessions_grants_after_its_first_write_its_row_only_when_it_changes(
    unique,
) -> None:
    """MariaDB: a session's first grant is the procedure's call, which tells it the
    server run's epoch and writes its row. Its next grants of the same name by the same
    holder (thread and context) write nothing: the row names them already, and counts
    again once the lock is granted. A grant of another name, or by another context, is
    one ``INSERT ... SELECT`` that rewrites the row. Each is listed with its own holder,
    and its grant's time (the session's idle time), and their tokens keep growing."""
    require_mysql()
    backend, name, other = locks["mysql-session"], unique("same"), unique("other")
    backend.run("SELECT 1", [], "opening")  # the listing's own session, opened first
    backend.pool.close()  # the grants below on one new session
    tokens, sessions, writes = [], set(), []
    for grant_name, context in [(name, ""), (name, ""), (name, ""), (other, ""),
                                (other, "GET /pay"), (other, "GET /pay")]:
        handle = backend.lock(grant_name)
        with holder_context(context) if context else contextlib.nullcontext():
            assert handle.acquire(blocking=False)
        session = handle._hold.acquisition.taken
        sessions.add(session)
        tokens.append(handle.fencing_token)
        (info,) = backend.held_locks(prefix=grant_name)
        assert (info.owner, info.host, info.pid, info.thread, info.context) == (
            "", socket.gethostname(), os.getpid(), handle.holder.thread, context)
        assert abs((info.acquired_at - handle.acquired_at).total_seconds()) < 0.5
        assert _session_rows(backend, session) == [(0, backend.make_key(grant_name))]
        writes.append(_statements(session))
        handle.release()
    (session,) = sessions
    # The session's setup called django_distlock_session_open; its first grant the
    # procedure; the grants after it wrote a row only at the new name and new context.
    assert [(w["Com_call_procedure"], w["Com_insert_select"]) for w in writes] == [
        (2, 0), (2, 0), (2, 0), (2, 1), (2, 2), (2, 2)]
    # The first grant's row: the procedure's REPLACE (counted in the session too).
    assert {(w["Com_replace"], w["Com_insert"]) for w in writes} == {(1, 0)}
    assert tokens == sorted(set(tokens))
    again = backend.lock(name)  # a new session's grant: the procedure's token, above
    backend.pool.close()
    assert again.acquire(blocking=False)
    try:
        assert again.fencing_token > tokens[-1]
    finally:
        again.release()


def test_a_mysql_wait_on_a_session_whose_row_names_it_writes_nothing_and_is_listed(
    unique, distlock_hold_elsewhere,
) -> None:
    """MariaDB: a thread that held a name and waits for it again, on the same session,
    waits in one ``SELECT GET_LOCK(...)`` (no procedure, no row written): the waiters'
    listing finds it in the process list, with its owner id, host, process and thread,
    and once granted its holder is listed from the session's row."""
    require_mysql()
    backend, name = locks["mysql-session"], unique("rowless")
    backend.run("SELECT 1", [], "opening")  # the listing's own session, opened first
    ready, go = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def wait() -> bool:
        first = backend.lock(name)
        assert first.acquire(blocking=False)
        seen["session"] = session = first._hold.acquisition.taken
        first.release()
        seen["before"] = _statements(session)
        ready.set()
        assert go.wait(10)
        handle = backend.lock(name, timeout=10)
        if not handle.acquire():
            return False
        try:
            seen["taken"], seen["owner"] = handle._hold.acquisition.taken, handle.owner_id
            seen["after"] = _statements(session)
            seen["listed"] = backend.held_locks(prefix=name).locks
        finally:
            handle.release()
        return True

    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(wait()), name="the-rowless-waiter")
    thread.start()
    assert ready.wait(10)
    blocker = distlock_hold_elsewhere(name, using="mysql-session")
    go.set()
    try:
        assert eventually(lambda: backend.waiters(name), 5)
        (waiter,) = backend.waiters(name)
        statement = backend.run(
            "SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = %s",
            [seen["session"]._thread_id], "reading")[0][0]
    finally:
        blocker.release()
        thread.join(15)
    assert done == [True]
    assert statement.startswith("SELECT IF(GET_LOCK('dl:s:")
    assert seen["taken"] is seen["session"] and seen["after"] == seen["before"]
    assert (waiter.owner, waiter.host, waiter.pid, waiter.thread) == (
        seen["owner"], socket.gethostname(), os.getpid(), "the-rowless-waiter")
    assert [(info.name, info.thread) for info in seen["listed"]] == [
        (name, "the-rowless-waiter")]


def test_a_mysql_session_that_held_beside_another_grant_is_listed_once_after(
    unique, distlock_hold_elsewhere,
) -> None:
    """MariaDB: a lock waited for by a thread that holds another is granted on that
    lock's session, at slot 1 of the grants' table. Once both are released, the
    session's next grant of that same name must not leave it listed twice (its old row
    at slot 1 and its new one at slot 0): the next grant goes through the procedure,
    which deletes the rows past slot 0, and the one after without it."""
    require_mysql()
    backend = locks["mysql-session"]
    outer_name, inner_name = unique("outer"), unique("inner")
    backend.run("SELECT 1", [], "opening")
    # Held by another process: no session of this backend's is given back after the
    # pair's below (the pool hands out the last one given back).
    blocker = distlock_hold_elsewhere(inner_name, using="mysql-session")
    outer, inner = _waited_beside(backend, outer_name, inner_name, blocker.release)
    session = outer._hold.acquisition.taken
    assert _session_rows(backend, session) == [
        (0, backend.make_key(outer_name)), (1, backend.make_key(inner_name))]
    outer.release()
    inner.release()
    for _ in range(2):  # through the procedure, then without it
        again = backend.lock(inner_name)
        assert again.acquire(blocking=False)
        try:
            assert again._hold.acquisition.taken is session  # the pool's last given back
            assert [info.name for info in backend.held_locks(prefix=inner_name)] == [
                inner_name]
            assert _session_rows(backend, session) == [(0, backend.make_key(inner_name))]
        finally:
            again.release()


def test_a_full_grants_table_refuses_a_try_without_the_procedure_too(unique) -> None:
    """MariaDB: a session that knows its run tries without the procedure; if the table
    filled while the session held nothing and its row was gone (deleted by hand here),
    the try is refused as the procedure refuses it, with what to do, and its locks given
    back. (The sessions left in the pool are closed after: their rows were deleted.)"""
    require_mysql()
    backend = locks["mysql-session"]
    table = "django_distlock_session_grant"
    backend.run("SELECT 1", [], "opening")  # a session opened later would sweep the filler
    backend.pool.close()
    warm = backend.lock(unique("warm"))
    assert warm.acquire(blocking=False)
    session = warm._hold.acquisition.taken
    warm.release()
    backend.run(f"ALTER TABLE {table} MAX_ROWS = 3", [], "writing")
    try:
        backend.run(f"DELETE FROM {table}", [], "writing")  # the session's row too
        filled = 0
        with pytest.raises(DistLockError) as full:
            while filled < 1000:  # rows of no session: the table's rounded-up size
                backend.run(
                    f"INSERT INTO {table} (session, slot, lk, name, label, host, pid)"
                    " VALUES (%s, 0, 'dl:s:filler', 'filler', 'l', 'h', 1)",
                    [4_000_000_000 + filled], "writing")
                filled += 1
        assert mysql_errno(full.value.__cause__) == 1114 and filled >= 3
        handle = backend.lock(unique("refused"))
        with pytest.raises(DistLockError) as refused:
            handle.acquire(blocking=False)
        assert session.closed  # the try was the warm session's (a refused one is closed)
        assert "is full: raise max_heap_table_size" in str(refused.value)
        assert mysql_errno(refused.value.__cause__) == 1114
        assert not backend.is_locked(handle.name)
    finally:
        backend.run(f"DELETE FROM {table} WHERE session >= 4000000000", [], "cleaning")
        backend.run(f"ALTER TABLE {table} MAX_ROWS = 0", [], "writing")
        backend.pool.close()


@pytest.mark.parametrize("alias", ALIASES)
def test_a_killed_holder_frees_the_name_when_the_server_sees_its_connection_close(
    alias: str, unique, distlock_hold_elsewhere,
) -> None:
    """A holder process SIGKILLed: the kernel closes its socket, the server ends its
    session at once, and a waiter queued behind it is granted then: not after the
    server's keepalives (8 s) or the waiter's timeout (measured, recorded)."""
    _require(alias)
    backend, name = locks[alias], unique("killed")
    holder = distlock_hold_elsewhere(name, using=alias)
    granted: dict[str, float] = {}

    def wait() -> None:
        handle = backend.lock(name, timeout=20)
        if handle.acquire():
            granted["at"] = time.monotonic()
            handle.release()

    thread = threading.Thread(target=wait)
    thread.start()
    assert eventually(lambda: backend.waiters(name), 5)
    killed_at = time.monotonic()
    holder.kill()
    thread.join(25)
    assert "at" in granted
    freed_after = granted["at"] - killed_at
    record("killed-holder", alias, freed_after_s=round(freed_after, 3))
    assert freed_after < 4.0, freed_after  # the close, not the keepalives (8 s)


@contextlib.contextmanager
def _through(database: str, port: int) -> Iterator[None]:
    """The Django alias ``database`` connecting to ``port`` while the block runs (the
    handler's settings too: the backend's own sessions are made from them)."""
    connection = connections[database]
    saved = connection.settings_dict
    connection.close()
    connection.settings_dict = connections.settings[database] = {**saved, "PORT": str(port)}
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict = connections.settings[database] = saved


@pytest.mark.parametrize("alias", ALIASES)
def test_the_deploy_check_tells_a_proxy_between_django_and_the_server(alias: str) -> None:
    """A pooler in transaction mode hands a session, and its locks, to other clients: the
    deploy check sees a proxy when the server accepted the session on another port than
    the one configured. Direct: nothing; through a real TCP forwarder: W063."""
    _require(alias)
    assert "distlock.W063" not in [m.id for m in locks[alias].check(deploy=True)]
    database = locks[alias].database
    settings_dict = connections[database].settings_dict
    forwarder = Forwarder((str(settings_dict["HOST"]), int(settings_dict["PORT"])))
    params = {"BACKEND": _DB, "OPTIONS": {"DATABASE": database, "MODE": "session"}}
    try:
        with _through(database, forwarder.port):
            backend = DatabaseBackend(f"{alias}-through", params)
            try:
                found = [m for m in backend.check(deploy=True) if m.id == "distlock.W063"]
            finally:
                backend.close()
    finally:
        forwarder.close()
    assert len(found) == 1 and f"port {forwarder.port}" in found[0].msg, found


def test_a_full_grants_table_refuses_the_grant_and_gives_its_lock_back(unique) -> None:
    """MariaDB: the grants' table is a MEMORY table of a fixed size; a grant that finds it
    full is refused with an error that says what to do, its named lock given back (the
    name stays free), and the grants before it hold on. (The table is made small here
    with MAX_ROWS, as a small max_heap_table_size would make it: the server rounds it up
    to its blocks, about 14 rows.)"""
    require_mysql()
    backend = locks["mysql-session"]
    table = "django_distlock_session_grant"
    tag = unique("full")
    held: list[Any] = []
    with connections["mysql"].cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} MAX_ROWS = 3")
    try:
        with connections["mysql"].cursor() as cursor:
            cursor.execute(f"DELETE FROM {table}")  # other tests' rows that no longer count
        refused = None
        while refused is None and len(held) < 100:
            handle = backend.lock(f"{tag}:{len(held):03}")
            try:
                assert handle.acquire(blocking=False)
            except DistLockError as exc:
                refused = (handle, exc)
            else:
                held.append(handle)
        assert refused is not None, f"{len(held)} grants and none refused"
        handle, error = refused
        assert "is full: raise max_heap_table_size" in str(error)
        assert mysql_errno(error.__cause__) == 1114
        assert not backend.is_locked(handle.name)
        assert all(backend.is_locked(other.name) for other in held)
        assert len(backend.held_locks(prefix=tag, limit=200)) == len(held) >= 3
    finally:
        for handle in held:
            if handle.held:
                handle.release()
        with connections["mysql"].cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} MAX_ROWS = 0")
        backend.pool.close()  # their rows were deleted above: the sessions would not know


def test_a_standby_promoted_after_grants_goes_on_above_their_tokens(unique) -> None:
    """A failover on PostgreSQL: the primary's grants in session, lease and transaction
    mode, then its streaming standby promoted in its place (a real one: ``pg_basebackup``,
    ``pg_ctl promote``). The advisory locks were the primary's alone (the standby holds
    none: a session-mode holder of the primary holds nothing there); the standby's
    session table and epoch, ``UNLOGGED``, begin empty; each mode's tokens go on above
    every one the primary gave (session and transaction mode's from the fencing
    sequence, which the primary logs ahead of its use; lease mode's from the rows)."""
    require_pg()
    from django.db import transaction

    from .private_postgres import Postgres

    name = unique("promoted")

    def tokens(server: Postgres) -> dict[str, list[int]]:
        given: dict[str, list[int]] = {}
        with server.borrowed() as alias:
            for mode in ("session", "lease", "transaction"):
                backend = server.backend(alias, mode)
                try:
                    for _ in range(3):
                        with transaction.atomic(alias), backend.lock(name) as handle:
                            given.setdefault(mode, []).append(handle.fencing_token)
                finally:
                    backend.close()
        return given

    primary, standby = Postgres(), Postgres()
    primary.start()
    try:
        with primary.borrowed():
            pass  # migrated before the standby's copy
        standby.follow(primary)
        before = tokens(primary)
        with primary.borrowed() as alias:  # a holder of the primary's, there at the failover
            holder = primary.backend(alias, "session")
            held = holder.lock(name)
            assert held.acquire(blocking=False)
            standby.promote(primary)
            assert standby.sql("SELECT (SELECT count(*) FROM django_distlock_session),"
                               " (SELECT count(*) FROM django_distlock_epoch)") == [(0, 0)]
            with standby.borrowed() as other:
                fresh = standby.backend(other, "session")
                try:
                    assert list(fresh.held_locks()) == []
                    # None there. (From another thread: this one holds the name on the
                    # old primary, through a backend of the same alias.)
                    assert in_thread(fresh.lock(name).acquire)
                finally:
                    fresh.close()
            held.release()  # its own server's lock: the old primary still runs
            holder.close()
        after = tokens(standby)
    finally:
        standby.stop()
        primary.stop()
    for mode, given in before.items():
        assert min(after[mode]) > max(given), (mode, before, after)
