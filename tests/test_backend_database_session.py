"""Session mode on PostgreSQL (``backends/database/session_mode.py``): the contract, and
what session locks add: the name's key, a grant on its own session, the listing from
the server's lock table, force release by ending the holder's session, deadlocks."""

from __future__ import annotations

import pytest

from django_distlock.testing import LockContract

from .conftest import LIBRARY_DB, require_pg

pytestmark = LIBRARY_DB


class TestPostgresSession(LockContract):
    alias = "pg-session"

    @pytest.fixture(autouse=True)
    def _pg(self) -> None:
        require_pg()
