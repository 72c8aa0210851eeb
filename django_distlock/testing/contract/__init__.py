"""The contract every lock backend passes, shipped so that any backend runs it.

In a pytest module, subclass :class:`LockContract` and name the alias under test
(add pytest-django's ``django_db`` mark when the backend uses a database)::

    from django_distlock.testing.contract import LockContract

    class TestMyBackend(LockContract):
        alias = "mine"          # configured in the test settings' DISTLOCK

Under ``manage.py test``, mix :class:`BackendContractTests` into a Django test case::

    from django.test import TransactionTestCase
    from django_distlock.testing.contract import BackendContractTests

    class MyBackendContractTests(BackendContractTests, TransactionTestCase):
        alias = "mine"

Both run the same checks (``checks.ContractChecks``): acquire, release, waiting,
expiry, fencing, names, signals, listing and force release, ``multi_lock``, the
kinds of lock the backend's flags offer, and each ``supports_*`` flag both ways.
Only :class:`LockContract` needs pytest (imported on its first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .checks import ContractChecks, check_names
from .support import (
    BAD_NAMES,
    BAD_TYPES,
    FLAGS,
    ODD_NAMES,
    held_elsewhere,
    in_thread,
    io_calls,
    raises,
)
from .unittest_suite import BackendContractTests

if TYPE_CHECKING:
    from .pytest_suite import LockContract

__all__ = [
    "BAD_NAMES", "BAD_TYPES", "FLAGS", "ODD_NAMES", "BackendContractTests", "ContractChecks",
    "LockContract", "check_names", "held_elsewhere", "in_thread", "io_calls", "raises",
]


def __getattr__(name: str) -> Any:
    if name == "LockContract":
        from .pytest_suite import LockContract

        return LockContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
