"""The contract on PostgreSQL's lease mode, whose statements run on the backend's own
psycopg sessions (Django only opens their connections): decided by PostgreSQL and our
routines, so it runs in one env (CONTRIBUTING.md, "The tiers"). The other database
modes: ``test_backend_database.py``."""

from __future__ import annotations

import pytest

from django_distlock.testing import LockContract

from .conftest import LIBRARY_DB, require_pg

pytestmark = LIBRARY_DB


class TestPostgresLease(LockContract):
    alias = "pg-lease"

    @pytest.fixture(autouse=True)
    def _pg(self) -> None:
        require_pg()
