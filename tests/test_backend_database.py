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
