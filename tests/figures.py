"""Figures of the fault catalogue, gathered for docs/reliability.md (issue 22).

A scenario calls :func:`record` once per backend it ran on, with what it measured
(``processes=8, acquisitions=412, overlaps=0, repeated_tokens=0, ...``). While the
environment variable ``DISTLOCK_FIGURES`` names a file, each call appends one JSON
line to it; otherwise a call does nothing, so the tests cost the same either way.
The report's generator reads those lines and writes the tables.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["record", "record_history"]


def record(scenario: str, backend: str, **figures: Any) -> None:
    """Append ``figures`` of ``scenario`` on ``backend`` to ``$DISTLOCK_FIGURES``, if set.

    :param scenario: the scenario's short name, stable across runs.
    :param backend: the lock alias (and kind, when not exclusive: ``"pg-lease/read"``).
    :param figures: JSON-serialisable values: counts, seconds (named ``*_s``), bounds.
    """
    path = os.environ.get("DISTLOCK_FIGURES")
    if not path:
        return
    line = json.dumps({"scenario": scenario, "backend": backend, "at": time.time(),
                       "pid": os.getpid(), "cpus": os.cpu_count(),
                       "soak": os.environ.get("DISTLOCK_SOAK") == "1", **figures},
                      sort_keys=True, default=str)
    with open(path, "a", encoding="utf-8") as out:  # one write per line: O_APPEND is atomic
        out.write(line + "\n")


def record_history(scenario: str, backend: str, report: Any, **figures: Any) -> None:
    """:func:`record` the counts of a checked history (a ``HistoryReport``) and ``figures``.

    :param scenario: the scenario's short name.
    :param backend: the lock alias (and kind).
    :param report: what :func:`django_distlock.testing.history.check` returned.
    :param figures: more figures of the run (bounds, times).
    """
    record(scenario, backend, processes=report.processes, acquisitions=report.holds,
           overlaps=len(report.overlaps), repeated_tokens=len(report.repeated_tokens),
           stale_writes_accepted=len(report.backwards_writes), **figures)
