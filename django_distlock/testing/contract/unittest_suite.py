"""The contract as a ``unittest`` mixin, for ``manage.py test``: mix
:class:`BackendContractTests` into a Django test case and set ``alias``."""

from __future__ import annotations

from collections.abc import Callable

from ...backends.base import BaseLockBackend
from ...handler import locks
from .checks import ContractChecks, add_tests


class BackendContractTests(ContractChecks):
    """Behaviour every backend must show, as ``unittest`` tests (the same checks as
    :class:`~django_distlock.testing.contract.LockContract`)::

        from django.test import SimpleTestCase, TransactionTestCase

        class LocMemContractTests(BackendContractTests, SimpleTestCase):
            alias = "locmem"

        class DatabaseContractTests(BackendContractTests, TransactionTestCase):
            alias = "sqlite-lease"
            databases = {"default"}

    A backend on a database needs :class:`~django.test.TransactionTestCase`: the
    checks take locks from other threads, which ``TestCase``'s open transaction
    would keep waiting.
    """

    alias: str

    @property
    def backend(self) -> BaseLockBackend:
        """The backend under test."""
        return locks[self.alias]


def _test(what: str) -> Callable[[BackendContractTests], None]:
    def test(self: BackendContractTests) -> None:
        getattr(self, f"check_{what}")(self.backend)

    return test


add_tests(BackendContractTests, _test)
