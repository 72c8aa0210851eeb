"""Session mode's statements on PostgreSQL, run through libpq (``prepared.py``): prepared
once per session, and failing as psycopg's cursor would fail, so that ``errors.py`` maps
them as before (a server's error by its SQLSTATE, a broken connection as lost)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connections

from django_distlock import locks
from django_distlock.backends.database import session_mode
from django_distlock.backends.database.errors import connection_lost, sqlstate
from django_distlock.backends.database.prepared import Prepared, fetch
from django_distlock.backends.database.sessions import Session
from django_distlock.exceptions import InvalidBackendOptions

from .conftest import LIBRARY_DB, require_pg

pytestmark = [LIBRARY_DB]

_DIVIDE = Prepared("test_divide", "SELECT 10 / %s::int, 'ten'")


@pytest.fixture
def session() -> Iterator[Session]:
    require_pg()
    session = locks["pg-session"].pool.take()  # type: ignore[attr-defined]
    try:
        yield session
    finally:
        session.close()


def test_a_statement_is_prepared_once_per_session_and_gives_text(session: Session) -> None:
    first = fetch(session.pgconn, session.prepared, _DIVIDE, [b"2"])
    second = fetch(session.pgconn, session.prepared, _DIVIDE, [b"5"])
    assert (first, second) == ((b"5", b"ten"), (b"2", b"ten"))
    with session.mutex:
        rows = session.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE name = %s",
            ["django_distlock_test_divide"]).fetchall()
    assert rows == [(1,)]
    assert _DIVIDE.sql == b"SELECT 10 / $1::int, 'ten'"


def test_no_row_is_none(session: Session) -> None:
    nothing = Prepared("test_nothing", "SELECT 1 WHERE %s::int > 1")
    assert fetch(session.pgconn, session.prepared, nothing, [b"0"]) is None


def test_a_server_error_is_psycopgs_own_and_the_session_goes_on(session: Session) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero) as raised:
        fetch(session.pgconn, session.prepared, _DIVIDE, [b"0"])
    assert sqlstate(raised.value) == "22012"
    assert not connection_lost(raised.value)
    assert fetch(session.pgconn, session.prepared, _DIVIDE, [b"1"]) == (b"10", b"ten")


def test_a_statement_the_server_refuses_to_prepare_fails_before_running(
        session: Session) -> None:
    broken = Prepared("test_broken", "SELECT no_such_column_here + %s::int")
    with pytest.raises(psycopg.errors.UndefinedColumn):
        fetch(session.pgconn, session.prepared, broken, [b"1"])
    assert b"django_distlock_test_broken" not in session.prepared


def test_a_connection_cut_under_the_session_is_lost(session: Session) -> None:
    fetch(session.pgconn, session.prepared, _DIVIDE, [b"1"])
    session.cut()  # the watchdog's cut: the socket shut down
    with pytest.raises(psycopg.OperationalError) as raised:
        fetch(session.pgconn, session.prepared, _DIVIDE, [b"1"])
    assert sqlstate(raised.value) is None
    assert connection_lost(raised.value)
    assert not session.usable


def test_session_mode_on_psycopg2_is_refused_at_construction(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """psycopg 3 is the only PostgreSQL driver here; this stands in for a site on
    psycopg2 (Django's choice when psycopg 3 is missing)."""
    require_pg()
    monkeypatch.setattr(session_mode, "_psycopg3", lambda: False)
    with pytest.raises(InvalidBackendOptions, match="psycopg 3"):
        session_mode.SessionModeBackend(
            "psycopg2-site", {"OPTIONS": {"DATABASE": "pg", "MODE": "session"}})



def test_a_session_the_server_ended_is_lost_and_says_why(session: Session) -> None:
    """Ended while idle, the session's next statement fails as lost, with the server's
    reason (libpq reads it with the closed connection: psycopg's cursor raises
    ``AdminShutdown``, 57P01; both are ``OperationalError`` and count as lost)."""
    fetch(session.pgconn, session.prepared, _DIVIDE, [b"1"])
    with session.mutex:
        (pid,) = session.execute("SELECT pg_backend_pid()", None).fetchone()
    with connections["pg"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
    with pytest.raises(psycopg.OperationalError) as raised:
        fetch(session.pgconn, session.prepared, _DIVIDE, [b"1"])
    assert "terminating connection due to administrator command" in str(raised.value)
    assert connection_lost(raised.value)
