"""The flash sale's result: one row per strategy, a table, and a verdict."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from .strategies import Strategy
from .worker import BOUGHT, ERROR, LOCK_TIMEOUT, WorkerResult

COLUMNS = (
    "strategy",
    "units sold",
    "oversold",
    "purchases/s",
    "lock wait p50 (ms)",
    "lock wait p99 (ms)",
    "errors",
)


@dataclass
class StrategyReport:
    """How one strategy did, from the database's orders and the workers' records."""

    strategy: Strategy
    stock: int = 0
    #: Units in the product's orders, as the database has them.
    sold: int = 0
    stock_left: int = 0
    #: Seconds from the start signal to the last worker's last attempt.
    elapsed: float = 0.0
    lock_waits: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    fatal: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @classmethod
    def build(
        cls, strategy: Strategy, stock: int, sold: int, stock_left: int, results: list[WorkerResult]
    ) -> StrategyReport:
        report = cls(strategy, stock, sold, stock_left)
        for result in results:
            report.lock_waits.extend(result.lock_waits)
            report.outcomes.update(result.outcomes)
            report.errors.extend(result.errors)
            if result.fatal:
                report.fatal.append(f"{result.name} (pid {result.pid}): {result.fatal}")
        starts = [r.started for r in results if r.started is not None]
        ends = [r.finished for r in results if r.finished is not None]
        report.elapsed = max(ends) - min(starts) if starts and ends else 0.0
        return report

    @property
    def oversold(self) -> int:
        return max(self.sold - self.stock, 0)

    @property
    def failed_attempts(self) -> int:
        return self.outcomes[ERROR] + self.outcomes[LOCK_TIMEOUT]

    def problems(self) -> list[str]:
        """What is wrong with a locking strategy's result (nothing for "no lock" or skipped)."""
        if not self.strategy.locking or self.strategy.skipped:
            return []
        label, found = self.strategy.label, []
        if self.oversold:
            found.append(f"{label} oversold {self.oversold} units")
        if self.stock_left < 0:
            found.append(f"{label} drove the stock to {self.stock_left}")
        if self.sold < self.stock:
            found.append(f"{label} sold only {self.sold} of {self.stock} units")
        if not self.oversold and self.sold + self.stock_left != self.stock:
            found.append(
                f"{label}: orders ({self.sold}) and stock left ({self.stock_left}) "
                f"do not add up to {self.stock}"
            )
        if self.outcomes[BOUGHT] != self.sold:
            found.append(
                f"{label}: workers counted {self.outcomes[BOUGHT]} purchases, "
                f"the database has {self.sold}"
            )
        found.extend(f"{label}: {fatal}" for fatal in self.fatal)
        return found

    def cells(self) -> tuple[str, ...]:
        if self.strategy.skipped:
            return (self.strategy.label, f"skipped: {self.strategy.skipped}")
        oversold = str(self.oversold)
        if self.stock_left < 0:
            oversold += f" (stock {self.stock_left})"
        rate = self.sold / self.elapsed if self.elapsed > 0 else 0.0
        waits = self.lock_waits
        return (
            self.strategy.label,
            str(self.sold),
            oversold,
            f"{rate:.1f}",
            _ms(percentile(waits, 50)) if waits else "-",
            _ms(percentile(waits, 99)) if waits else "-",
            str(self.failed_attempts),
        )


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of non-empty ``values``."""
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def table(reports: list[StrategyReport]) -> list[str]:
    """Render the reports as an aligned text table, cells separated by ``|``."""
    rows = [report.cells() for report in reports]
    full = [row for row in rows if len(row) == len(COLUMNS)]
    widths = [max(len(row[i]) for row in [COLUMNS, *full]) for i in range(len(COLUMNS))]
    widths[0] = max(widths[0], *(len(row[0]) for row in rows))

    def line(cells: tuple[str, ...]) -> str:
        if len(cells) < len(COLUMNS):  # a skipped strategy: its reason spans the row
            return f"{cells[0].ljust(widths[0])} | {cells[1]}"
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return " | ".join([first, *rest])

    rule = "-+-".join("-" * width for width in widths)
    return [line(COLUMNS), rule, *(line(row) for row in rows)]


def verdict(reports: list[StrategyReport]) -> tuple[bool, str]:
    """Return (passed, the verdict line): no locking strategy may oversell or lose a sale."""
    problems = [problem for report in reports for problem in report.problems()]
    ran = [r for r in reports if r.strategy.locking and not r.strategy.skipped]
    skipped = [r.strategy.label for r in reports if r.strategy.skipped]
    notes = []
    for report in reports:
        if not report.strategy.locking:
            notes.append(
                f'"no lock" oversold {report.oversold} units, the race the locks prevent'
                if report.oversold
                else '"no lock" did not oversell this time (the race depends on timing: '
                "try more --workers or a longer --work)"
            )
    if skipped:
        notes.append(f"skipped: {', '.join(skipped)}")
    tail = f"; {'; '.join(notes)}." if notes else "."
    if problems:
        return False, f"Verdict: FAIL: {'; '.join(problems)}{tail}"
    if not ran:
        return True, f"Verdict: no locking strategy ran{tail}"
    return True, (
        f"Verdict: PASS: every locking strategy ({len(ran)}) sold exactly the stock "
        f"and oversold 0{tail}"
    )
