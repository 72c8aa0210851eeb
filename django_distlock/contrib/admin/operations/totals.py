"""How many locks each alias holds, for the top of the held-locks page and the command.

Each alias answers with its backend's :meth:`~..backends.base.BaseLockBackend.count_held`
(exact, or "at least N" at the cap); an alias whose backend cannot count says "unknown"
and why; one whose server fails says so. A total is exact only when every part is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django_distlock.backends.base import COUNT_CAP, HeldCount
from django_distlock.exceptions import DistLockError, LockConfigurationError, UnsupportedOperation
from django_distlock.handler import locks

from .listing import backend_label


@dataclass(frozen=True, slots=True)
class AliasTotal:
    """One alias' count of held locks, or why there is none."""

    alias: str
    label: str
    #: None: unknown (see ``reason``).
    count: HeldCount | None
    #: Why the count is unknown: the backend cannot count, or its server failed.
    reason: str = ""
    failed: bool = False
    #: An earlier alias configured alike (same backend, location, options, key prefix):
    #: the same locks, counted once (there) and not again in the sum.
    same_as: str = ""

    @property
    def text(self) -> str:
        """The count as the page shows it: "12", "at least 10,000", "at least 3, at
        most 12", "unknown"."""
        return "unknown" if self.count is None else describe(self.count)


def describe(count: HeldCount) -> str:
    """Return a count as words: exact, "at least N", or "at least N, at most M".

    :param count: the count.
    :returns: the text.
    """
    if count.exact:
        return f"{count.count:,}"
    if count.at_most is not None:
        return f"at least {count.count:,}, at most {count.at_most:,}"
    return f"at least {count.count:,}"


def count_totals(
    aliases: Sequence[str], prefix: str = "", limit: int = COUNT_CAP
) -> list[AliasTotal]:
    """Count the locks held on each alias (names starting with ``prefix``), each up to
    ``limit``; never raises for an alias (its total says why it is unknown).

    :param aliases: the aliases, in the order to show.
    :param prefix: the start of the names counted ("": all).
    :param limit: where each alias stops counting.
    :returns: one total per alias.
    """
    totals: list[AliasTotal] = []
    counted: dict[str, AliasTotal] = {}
    for alias in aliases:
        try:
            backend = locks[alias]
        except LockConfigurationError as exc:
            totals.append(AliasTotal(alias, "?", None, f"misconfigured: {exc}", failed=True))
            continue
        label = backend_label(backend)
        if not backend.supports_counting:
            why = backend.why_unsupported
            reason = why.get("supports_counting") or why.get("supports_listing") or (
                f"{type(backend).__name__} cannot count its locks")
            totals.append(AliasTotal(alias, label, None, reason))
            continue
        same = repr((type(backend), backend.location, backend.options, backend.key_prefix))
        if same in counted:
            first = counted[same]
            totals.append(AliasTotal(alias, label, first.count, first.reason, first.failed,
                                     first.alias))
            continue
        try:
            total = AliasTotal(alias, label, backend.count_held(prefix, limit))
        except (DistLockError, UnsupportedOperation) as exc:
            total = AliasTotal(alias, label, None, str(exc) or type(exc).__name__, True)
        counted[same] = total
        totals.append(total)
    return totals


def grand_total(totals: Sequence[AliasTotal]) -> str:
    """Return the sum of ``totals`` as words (an alias configured like an earlier one
    counted once): exact only when every alias' count is.

    :param totals: the aliases' totals.
    :returns: "12", or "at least 10,012" when one is a floor or unknown.
    """
    totals = [t for t in totals if not t.same_as]
    counted = sum(t.count.count for t in totals if t.count is not None)
    if all(t.count is not None and t.count.exact for t in totals):
        return f"{counted:,}"
    return f"at least {counted:,}"
