"""Test utilities for code that takes locks (see docs/testing.md).

- :mod:`~django_distlock.testing.elsewhere`: ``hold_elsewhere()`` makes another OS
  process hold a lock; ``run_in_processes()`` runs a function in several at once.
- :mod:`~django_distlock.testing.faults`: ``make_lost()`` takes a lock from its holder;
  ``expire_session()`` ends a ZooKeeper session; ``backend_unavailable()`` cuts an
  alias from its server.
- :mod:`~django_distlock.testing.history`: record what worker processes do with
  locks and check the history (needs nothing but the standard library);
  :class:`~django_distlock.testing.checked.CheckedHistory` checks its own file.
- :mod:`~django_distlock.testing.mixins`: ``LockTestMixin``, the same for
  ``manage.py test``; :mod:`~django_distlock.testing.pytest_plugin`: the ``distlock_*``
  fixtures (active once the package is installed).
- :mod:`~django_distlock.contrib.celery.testing`: ``CeleryWorkers`` starts real ``celery
  worker`` processes on a queue of their own and stops them (needs Celery; imported
  on first use).
- :mod:`~django_distlock.testing.signals`: ``signals_sent()`` records the lock
  signals a block sends.
- :mod:`~django_distlock.testing.contract`: the contract suite every lock backend
  passes, as a pytest class (``LockContract``, needs pytest) and a unittest mixin
  (``BackendContractTests``, for ``manage.py test``); imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .checked import CheckedHistory
from .elsewhere import Elsewhere, hold_elsewhere, run_in_processes
from .faults import backend_unavailable, expire_session, make_lost
from .history import HistoryRecorder, HistoryReport, check, load, stock
from .mixins import LockTestMixin
from .signals import signals_sent

if TYPE_CHECKING:
    from .contract import BackendContractTests, LockContract, in_thread

__all__ = [
    "BackendContractTests",
    "CheckedHistory",
    "Elsewhere",
    "HistoryRecorder",
    "HistoryReport",
    "LockContract",
    "LockTestMixin",
    "backend_unavailable",
    "check",
    "expire_session",
    "hold_elsewhere",
    "in_thread",
    "load",
    "make_lost",
    "run_in_processes",
    "signals_sent",
    "stock",
]


def __getattr__(name: str) -> Any:
    if name in ("BackendContractTests", "LockContract", "in_thread"):
        from . import contract

        return getattr(contract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
