"""The contract on the database backend: PostgreSQL and SQLite, lease and transaction modes."""

from __future__ import annotations

import pytest

from .conftest import DATABASES, require_pg
from .contract import LockContract

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)


class TestSQLiteLease(LockContract):
    alias = "sqlite-lease"


class TestSQLiteTransaction(LockContract):
    alias = "sqlite-tx"


class PostgresContract(LockContract):
    @pytest.fixture(autouse=True)
    def _pg(self) -> None:
        require_pg()


class TestPostgresLease(PostgresContract):
    alias = "pg-lease"


class TestPostgresTransaction(PostgresContract):
    alias = "pg-tx"


def _prepared_statements(backend) -> int:
    cursor = backend._cursor()
    cursor.execute("SELECT count(*) FROM pg_prepared_statements")
    return cursor.fetchone()[0]


@pytest.mark.parametrize("prepare", [True, False])
def test_postgres_lease_statements_prepared_unless_disabled(settings, unique, prepare) -> None:
    """OPTIONS["PREPARE"]: prepared lease statements, or none (PgBouncer transaction pooling)."""
    require_pg()
    from django_distlock import locks

    settings.DISTLOCK = {
        **settings.DISTLOCK,
        "pg-prepare": {"BACKEND": settings.DISTLOCK["pg-lease"]["BACKEND"],
                       "OPTIONS": {"DATABASE": "pg", "PREPARE": prepare}},
    }
    backend = locks["pg-prepare"]
    try:
        for grant in range(1, 4):
            with backend.lock(unique(), ttl=5) as handle:
                assert handle.fencing_token == grant
        assert (_prepared_statements(backend) >= 2) is prepare
    finally:
        backend.close()
