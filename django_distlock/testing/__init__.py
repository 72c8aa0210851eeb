"""Test utilities for code that takes locks.

- :mod:`~django_distlock.testing.history`: record what worker processes do with
  locks and check the history (needs nothing but the standard library).
- :mod:`~django_distlock.testing.signals`: ``signals_sent()`` records the lock
  signals a block sends.
- :mod:`~django_distlock.testing.contract`: the contract suite every lock backend
  passes, as a pytest class (``LockContract``, needs pytest) and a unittest mixin
  (``BackendContractTests``, for ``manage.py test``); imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .history import HistoryRecorder, HistoryReport, check, load, stock
from .signals import signals_sent

if TYPE_CHECKING:
    from .contract import BackendContractTests, LockContract, in_thread

__all__ = [
    "BackendContractTests", "HistoryRecorder", "HistoryReport", "LockContract", "check",
    "in_thread", "load", "signals_sent", "stock",
]


def __getattr__(name: str) -> Any:
    if name in ("BackendContractTests", "LockContract", "in_thread"):
        from . import contract

        return getattr(contract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
