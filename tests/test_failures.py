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


def test_postgres_backend_terminated(unique) -> None:
    require_pg()
    backend = locks["pg-lease"]
    handle = backend.lock(unique())
    assert handle.acquire()
    _terminate_lease_connection(backend)
    with pytest.raises(BackendUnavailable) as info:
        handle.release()
    # Lease statements run on the raw psycopg connection: the cause is psycopg's error.
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    assert handle.held  # nothing was lost: the release can be retried
    handle.release()  # on a new connection
    assert not handle.held


def test_bad_sql_state_is_unavailable_not_a_grant(unique) -> None:
    require_pg()
    backend = locks["pg-lease"]
    _terminate_lease_connection(backend)
    with pytest.raises(BackendUnavailable):
        backend.lock(unique()).acquire(blocking=False)
    assert backend.health() > 0


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
