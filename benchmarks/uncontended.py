"""Suite ``uncontended``: acquire+release latency of one client on one free key.

Every case's Locker is built once, in this process, on its own key. Each
round runs every case in turn (the order rotates between rounds, so noise
from the rest of the machine spreads over all rows), ``warmup`` untimed
pairs then ``iterations`` timed ones. Percentiles are over the samples of
all rounds pooled; "p50 per round" shows how much the rounds disagreed.
"""

from __future__ import annotations

from collections.abc import Sequence

from .harness import (
    Case,
    Column,
    Locker,
    Options,
    Row,
    Suite,
    add_suite,
    percentile,
    progress,
    spread_us,
    time_pairs,
    us,
)

NAME = "uncontended"


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """Time every case's acquire+release pairs; return one row per case."""
    lockers: dict[str, Locker] = {}
    acquired: dict[str, list[int]] = {case.name: [] for case in cases}
    released: dict[str, list[int]] = {case.name: [] for case in cases}
    round_p50: dict[str, list[float]] = {case.name: [] for case in cases}
    try:
        for case in cases:
            lockers[case.name] = case.factory(f"bench:{NAME}:{case.name}")
        for round_ in range(options.repeat):
            shift = round_ % len(cases)
            for case in [*cases[shift:], *cases[:shift]]:
                progress(f"{NAME}: round {round_ + 1}/{options.repeat}, {case.name}")
                acq, rel = time_pairs(lockers[case.name], options.iterations, options.warmup)
                acquired[case.name] += acq
                released[case.name] += rel
                round_p50[case.name].append(percentile(_totals(acq, rel), 50))
    finally:
        for locker in lockers.values():
            locker.close()
    rows = []
    for case in cases:
        acq, rel = acquired[case.name], released[case.name]
        total = _totals(acq, rel)
        rows.append(
            Row(
                case,
                {
                    "n": len(total),
                    "p50": percentile(total, 50),
                    "p99": percentile(total, 99),
                    "acquire_p50": percentile(sorted(acq), 50),
                    "release_p50": percentile(sorted(rel), 50),
                    "round_p50": spread_us(round_p50[case.name]),
                },
            )
        )
    return rows


def _totals(acquired: list[int], released: list[int]) -> list[int]:
    """Sorted acquire+release durations of each pair."""
    return sorted(a + r for a, r in zip(acquired, released, strict=True))


def _notes(options: Options) -> str:
    return (
        f"One process, one key per case, {options.repeat} round(s) x {options.iterations} "
        f"timed acquire+release pairs (after {options.warmup} untimed), cases interleaved; "
        "`perf_counter_ns` around each call, GC off while timing. Times in µs; "
        "`x ref` = this row's p50 / the reference row's p50 (same server, same run)."
    )


SUITE = add_suite(
    Suite(
        name=NAME,
        title="Uncontended acquire + release (one process, one key)",
        run=run,
        columns=(
            Column("n", "n"),
            Column("p50", "p50 µs", us),
            Column("p99", "p99 µs", us),
            Column("acquire_p50", "acquire p50", us),
            Column("release_p50", "release p50", us),
            Column("round_p50", "p50 per round"),
        ),
        ratio_metric="p50",
        notes=_notes,
    )
)
