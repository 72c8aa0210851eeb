"""A failing server gives BackendUnavailable chained to the client error, then recovers."""

from __future__ import annotations

import psycopg
import pytest

from django_distlock import locks
from django_distlock.exceptions import BackendUnavailable

from .conftest import DATABASES, psycopg_params, require_pg

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)


def _terminate_lease_connection(backend) -> None:
    pid = backend.sessions.get().cursor.connection.info.backend_pid
    with psycopg.connect(**psycopg_params(backend.database), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_postgres_terminated_session_is_replaced_once(unique) -> None:
    """A lease session the server ended (terminated, or gone in a restart) costs no
    error while a new connection works: the call runs again, once, on a new session
    (the first call of every process used to fail after a server restart)."""
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique())
    assert handle.acquire()
    _terminate_lease_connection(backend)
    handle.release()  # on a new connection; the row still named this owner
    assert not handle.held and not backend.is_locked(handle.name)
    _terminate_lease_connection(backend)
    other = backend.lock(unique())
    assert other.acquire(blocking=False)
    other.release()


def test_postgres_a_retried_attempt_finds_its_own_grant(unique) -> None:
    """An attempt whose grant committed but whose answer was lost is retried with the same
    owner token: it takes its own grant again (a new fencing token) instead of missing."""
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique(), ttl=30)
    assert handle.acquire()
    acquisition = handle._acquisition
    assert acquisition is not None
    again = acquisition.attempt()  # the same owner token, as a retry sends it
    assert again.fencing_token == handle.fencing_token + 1
    handle.release()


def test_postgres_refused_connection_is_unavailable(unique) -> None:
    """A lease connection the server refuses is BackendUnavailable too, on the first
    statement of a thread as on later ones."""
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique())
    backend.close()  # the next statement opens a new lease connection
    database = psycopg_params(backend.database)["dbname"]
    toggle = f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS %s'
    with psycopg.connect(**{**psycopg_params(backend.database), "dbname": "postgres"},
                         autocommit=True) as admin:
        admin.execute(toggle % "false")
        try:
            with pytest.raises(BackendUnavailable) as info:
                handle.acquire(blocking=False)
        finally:
            admin.execute(toggle % "true")
    assert "not currently accepting connections" in str(info.value.__cause__)
    assert handle.acquire(blocking=False)
    handle.release()
