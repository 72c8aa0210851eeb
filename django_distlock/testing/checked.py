"""A history recorder that checks its own file: what the ``distlock_history`` fixture and
:meth:`LockTestMixin.lock_history` give a test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .checker import HistoryReport, Write, check
from .history import HistoryRecorder, load

__all__ = ["CheckedHistory"]


class CheckedHistory(HistoryRecorder):
    """A :class:`~django_distlock.testing.history.HistoryRecorder` that checks its own file.

    Record with it in the test and in forked workers (``hold()``, ``ahold()``,
    ``invoke()``/``granted()``/``released()``, ``write()``), then :meth:`check`.

    :param path: the history file (created).
    :param invariant: the business invariant :meth:`check` applies by default (e.g.
        ``stock(initial=10)``).
    """

    def __init__(
        self, path: Any, invariant: Callable[[list[Write]], list[str]] | None = None
    ) -> None:
        super().__init__(path)
        self.invariant = invariant
        #: Whether the ``distlock_history`` fixture checks the history at the end of the
        #: test (set False in a test that records a bad history on purpose).
        self.check_at_end = True

    def events(self) -> list[Any]:
        """Return the events recorded so far by every process, in time order."""
        try:
            return load(self.path)
        except FileNotFoundError:
            return []

    def report(
        self, invariant: Callable[[list[Write]], list[str]] | None = None
    ) -> HistoryReport:
        """Check the history so far and return the report (nothing raised).

        :param invariant: overrides the recorder's ``invariant``.
        :returns: the :class:`~django_distlock.testing.checker.HistoryReport`.
        """
        return check(self.events(), invariant=invariant or self.invariant)

    def check(
        self, invariant: Callable[[list[Write]], list[str]] | None = None
    ) -> HistoryReport:
        """Check the history so far: no overlapping valid holds, no repeated or backwards
        fencing token, the invariant.

        :param invariant: overrides the recorder's ``invariant``.
        :returns: the report, when it is good.
        :raises HistoryError: (an ``AssertionError``) naming the first problems.
        """
        report = self.report(invariant)
        report.raise_if_bad()
        return report
