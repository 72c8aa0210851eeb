"""The testing kit for ``manage.py test``: :class:`LockTestMixin` for ``unittest`` test cases."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checked import CheckedHistory
from .checker import Write
from .elsewhere import Elsewhere, hold_elsewhere
from .faults import backend_unavailable, expire_session, make_lost

if TYPE_CHECKING:
    from ..backends.base import BaseLockBackend

__all__ = ["LockTestMixin"]


class LockTestMixin:
    """Mix into a ``django.test.TransactionTestCase`` (or ``TestCase``) to test code that
    takes locks: the helpers of :mod:`django_distlock.testing`, cleaned up with the test.

    ``class SaleTests(LockTestMixin, TransactionTestCase): ...``
    """

    if TYPE_CHECKING:

        def addCleanup(
            self, function: Callable[..., Any], /, *args: Any, **kwargs: Any
        ) -> None: ...

    def hold_elsewhere(
        self, name: str, using: str = "default", ttl: float = 60, timeout: float = 10
    ) -> Elsewhere:
        """Make another OS process hold ``name`` until the ``with`` block (or the test) ends;
        see :func:`~django_distlock.testing.elsewhere.hold_elsewhere`.

        :returns: the holder (a context manager; released at the test's cleanup at the latest).
        :raises UnsupportedOperation: for a process-local backend (``locmem``).
        :raises AssertionError: when the child could not take the lock.
        """
        holder = hold_elsewhere(name, using, ttl, timeout)
        self.addCleanup(holder.release)
        return holder

    def make_lost(self, handle: Any) -> None:
        """Take the lock away from its holder ``handle``; see
        :func:`~django_distlock.testing.faults.make_lost`.

        :raises LockNotHeld: when ``handle`` holds nothing.
        :raises UnsupportedOperation: when the backend cannot free another owner's lock.
        """
        make_lost(handle)

    def expire_session(self, using: str = "default") -> None:
        """End this process' ZooKeeper session of ``using``; see
        :func:`~django_distlock.testing.faults.expire_session`.

        :raises UnsupportedOperation: for a backend other than ZooKeeper.
        """
        expire_session(using)

    def backend_unavailable(
        self, using: str = "default"
    ) -> AbstractContextManager[BaseLockBackend]:
        """``with self.backend_unavailable("default"):`` the alias' server is unreachable;
        see :func:`~django_distlock.testing.faults.backend_unavailable`.

        :returns: the context manager.
        """
        return backend_unavailable(using)

    def lock_history(
        self, invariant: Callable[[list[Write]], list[str]] | None = None
    ) -> CheckedHistory:
        """Return a :class:`~django_distlock.testing.checked.CheckedHistory` in a temporary
        directory removed after the test; call its ``check()`` (or
        :meth:`assertHistoryOK`) once the processes are done.

        :param invariant: the business invariant to check (e.g. ``stock(initial=10)``).
        :returns: the recorder.
        """
        directory = tempfile.mkdtemp(prefix="distlock-history-")
        self.addCleanup(shutil.rmtree, directory, True)
        return CheckedHistory(Path(directory) / "history.jsonl", invariant)

    def assertHistoryOK(
        self, history: CheckedHistory
    ) -> None:
        """Fail unless ``history`` shows no overlap, no repeated or backwards token, and its
        invariant holds.

        :raises HistoryError: (an ``AssertionError``) naming the first problems.
        """
        history.check()
