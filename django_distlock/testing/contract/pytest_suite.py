"""The contract as a pytest class: subclass :class:`LockContract`, set ``alias``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ...backends.base import BaseLockBackend
from ...handler import locks
from .checks import ContractChecks, add_tests


class LockContract(ContractChecks):
    """Behaviour every backend must show, as pytest tests; ``alias`` names the backend
    under test (add pytest-django's ``django_db`` mark when it uses a database)::

        class TestMyBackend(LockContract):
            alias = "mine"
    """

    alias: str

    @pytest.fixture
    def backend(self) -> BaseLockBackend:
        """The backend under test."""
        return locks[self.alias]


def _test(what: str) -> Callable[[LockContract, BaseLockBackend], None]:
    def test(self: LockContract, backend: BaseLockBackend) -> None:
        getattr(self, f"check_{what}")(backend)

    return test


add_tests(LockContract, _test)
