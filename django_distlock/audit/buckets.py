"""Pre-aggregated activity: the audit trail's counts and wait/hold histograms per time
bucket, alias and name prefix (:class:`~django_distlock.models.LockActivity`).

The recorder's writer adds every batch of events it writes (:func:`add_events`), so the
activity page reads at most a few hundred rows per alias and prefix whatever the size of
the trail. Each event is counted in one bucket of each of :data:`SPANS` (one per window
of the page). Percentiles come from histograms of :data:`BOUNDS`: a p95 shown is the upper
bound of the histogram bucket it falls in (within a factor of sqrt(2), about 41 %).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q

from ..models import LockActivity, LockEvent

#: Bucket lengths in seconds kept: one per window of the activity page (1 h in minutes,
#: 6 h in 5 minutes, 24 h in 15 minutes, 7 days in 2 hours).
SPANS = (60, 300, 900, 7200)
#: Upper bounds (seconds) of the wait and hold histograms: 1 ms to about 2 days, each
#: sqrt(2) times the last; a value above the last is counted past it.
BOUNDS = tuple(0.001 * math.sqrt(2) ** k for k in range(55))
#: Keys per query that reads the rows a batch adds to.
_CHUNK = 100
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Key = tuple[int, datetime, str, str]


def name_prefix(name: str) -> str:
    """The group of a name: up to its first ``:`` (``order:42`` -> ``order:``)."""
    head, sep, _ = name.partition(":")
    return head + sep if sep else name


def bucket_start(at: datetime, span: int) -> datetime:
    """The start of the ``span``-second bucket ``at`` falls in (aligned on the epoch)."""
    seconds = math.floor((at - _EPOCH).total_seconds() / span) * span
    return _EPOCH + timedelta(seconds=seconds)


def slot(value: float) -> str:
    """The histogram key of ``value`` seconds (the index of its bound, as text for JSON)."""
    return str(bisect.bisect_left(BOUNDS, value))


def percentile(histogram: Mapping[str, int], fraction: float) -> float | None:
    """The nearest-rank percentile of a histogram: its bucket's upper bound (the last
    bound past the last bucket); None when empty."""
    total = sum(histogram.values())
    if not total:
        return None
    rank, seen = max(1, math.ceil(fraction * total)), 0
    for index in sorted(histogram, key=int):
        seen += histogram[index]
        if seen >= rank:
            return BOUNDS[min(int(index), len(BOUNDS) - 1)]
    return BOUNDS[-1]  # pragma: no cover - the loop reaches the rank


@dataclass
class Counts:
    """The additions to one bucket row."""

    acquired: int = 0
    failed: int = 0
    lost: int = 0
    forced: int = 0
    waits: dict[str, int] = field(default_factory=dict)
    holds: dict[str, int] = field(default_factory=dict)

    def merge_into(self, row: LockActivity) -> None:
        """Add these counts to ``row``'s."""
        row.acquired += self.acquired
        row.failed += self.failed
        row.lost += self.lost
        row.forced += self.forced
        for mine, theirs in ((self.waits, row.waits), (self.holds, row.holds)):
            for index, count in mine.items():
                theirs[index] = theirs.get(index, 0) + count


def _at(event: Mapping[str, Any]) -> tuple[datetime, datetime]:
    """When an event counts: (its start, for acquisitions and waits; its end)."""
    end: datetime = event["at"]
    start = event.get("acquired_at")
    return (start if start is not None else end), end


def collect(events: Iterable[Mapping[str, Any]]) -> dict[Key, Counts]:
    """The additions ``events`` (dicts of LockEvent fields) make to the bucket rows.

    A hold (released or lost, with ``acquired_at``) counts as an acquisition and a wait
    at its start, a hold time (and a loss) at its end; a ``released`` row without
    ``acquired_at`` (written before migration 0010, whose ``acquired`` row counted the
    acquisition) only its hold time; a failure, a force release where it happened.
    """
    added: dict[Key, Counts] = {}

    def counts(span: int, at: datetime, alias: str, prefix: str) -> Counts:
        key = (span, bucket_start(at, span), alias, prefix)
        found = added.get(key)
        if found is None:
            found = added[key] = Counts()
        return found

    for event in events:
        kind, waited, held = event["kind"], event.get("waited"), event.get("held")
        alias, prefix = event["alias"], name_prefix(event["name"])
        start, end = _at(event)
        for span in SPANS:
            if kind == LockEvent.FAILED:
                counts(span, end, alias, prefix).failed += 1
            elif kind == LockEvent.FORCE_RELEASED:
                counts(span, end, alias, prefix).forced += 1
            elif kind == LockEvent.ACQUIRED or event.get("acquired_at") is not None:
                at_start = counts(span, start, alias, prefix)
                at_start.acquired += 1
                if waited is not None:
                    at_start.waits[slot(waited)] = at_start.waits.get(slot(waited), 0) + 1
            if kind in (LockEvent.RELEASED, LockEvent.LOST):
                at_end = counts(span, end, alias, prefix)
                at_end.lost += kind == LockEvent.LOST
                if held is not None:
                    at_end.holds[slot(held)] = at_end.holds.get(slot(held), 0) + 1
    return added


def store(added: Mapping[Key, Counts], using: str | None = None, model: Any = None) -> None:
    """Add ``added`` to the bucket rows, in one transaction.

    Rows missing are inserted empty first (a conflict with another writer's insert is
    ignored), then every row is read locked and updated, in key order (two writers lock
    in the same order, so they do not deadlock). ``model``: a migration's historical
    LockActivity.
    """
    if not added:
        return
    keys = sorted(added)
    model = LockActivity if model is None else model
    manager = model.objects.db_manager(using)
    with transaction.atomic(using=manager.db):
        manager.bulk_create(
            [model(span=k[0], start=k[1], alias=k[2], prefix=k[3]) for k in keys],
            ignore_conflicts=True,
        )
        for first in range(0, len(keys), _CHUNK):
            chunk = keys[first : first + _CHUNK]
            where = Q()
            for span, start, alias, prefix in chunk:
                where |= Q(span=span, start=start, alias=alias, prefix=prefix)
            rows = list(
                manager.select_for_update()
                .filter(where)
                .order_by("span", "start", "alias", "prefix")
            )
            for row in rows:
                added[(row.span, row.start, row.alias, row.prefix)].merge_into(row)
            manager.bulk_update(rows, ["acquired", "failed", "lost", "forced", "waits", "holds"])


def add_events(events: Iterable[Mapping[str, Any]], using: str | None = None) -> None:
    """Count ``events`` (dicts of LockEvent fields) in the bucket rows.

    :param events: the events written (or being written) to the audit trail.
    :param using: the database alias (default: the router's for LockActivity).
    :raises DatabaseError: when the database fails (nothing is added then).
    """
    store(collect(events), using)
