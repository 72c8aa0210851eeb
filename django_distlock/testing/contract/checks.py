"""Every check of the contract in one class, and the list that both test forms
(``pytest_suite``, ``unittest_suite``) turn into tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .capabilities import CapabilityChecks
from .core import CoreChecks
from .kinds import KindChecks
from .renewal import RenewalChecks


class ContractChecks(CoreChecks, CapabilityChecks, KindChecks, RenewalChecks):
    """The whole contract: each ``check_<what>(backend)`` method is one test,
    ``test_<what>``, in both forms. A backend's test class may override a check
    (to add to it, never to weaken it)."""


def check_names() -> list[str]:
    """Return the ``<what>`` of every ``check_<what>`` method, in definition order.

    :returns: the names, each once.
    """
    names: list[str] = []
    for cls in (CoreChecks, CapabilityChecks, KindChecks, RenewalChecks):
        names.extend(name[len("check_"):] for name in vars(cls) if name.startswith("check_"))
    return names


def add_tests(cls: type, make: Callable[[str], Callable[..., None]]) -> None:
    """Give ``cls`` one ``test_<what>`` method per check, named and documented like it.

    :param cls: the test class.
    :param make: returns the test function that runs ``check_<what>``.
    """
    for what in check_names():
        test: Any = make(what)
        test.__name__ = test.__qualname__ = f"test_{what}"
        test.__doc__ = getattr(ContractChecks, f"check_{what}").__doc__
        setattr(cls, test.__name__, test)
