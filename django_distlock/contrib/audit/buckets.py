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
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, OperationalError, connections, transaction

from django_distlock.backends.database.errors import transaction_refused
from django_distlock.backoff import Backoff

from .models import LockActivity, LockEvent

#: Bucket lengths in seconds kept: one per window of the activity page (1 h in minutes,
#: 6 h in 5 minutes, 24 h in 15 minutes, 7 days in 2 hours).
SPANS = (60, 300, 900, 7200)
#: How long a purge keeps the buckets of a span (None: as long as the events): twice
#: the window that reads them.
KEEP = {60: timedelta(hours=2), 300: timedelta(hours=12), 900: timedelta(hours=48), 7200: None}
#: Upper bounds (seconds) of the wait and hold histograms: 1 ms to about 2 days, each
#: sqrt(2) times the last; a value above the last is counted past it.
BOUNDS = tuple(0.001 * math.sqrt(2) ** k for k in range(55))
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
    ``acquired_at`` (written by development versions before 0.1.0, whose ``acquired``
    row counted the acquisition) only its hold time; a failure, a force release where it happened.
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


def merge(into: dict[Key, Counts], added: Mapping[Key, Counts]) -> dict[Key, Counts]:
    """Add ``added`` to ``into`` (in memory); return ``into``."""
    for key, counts in added.items():
        mine = into.get(key)
        if mine is None:
            into[key] = counts
        else:
            counts.merge_into(mine)  # type: ignore[arg-type]
    return into


_FIELDS = ["acquired", "failed", "lost", "forced", "waits", "holds"]
#: Attempts at a batch whose new rows another writer inserted meanwhile.
_ATTEMPTS = 5


def _existing(manager: Any, added: Mapping[Key, Counts]) -> list[Any]:
    """The rows of ``added``'s keys, read locked in key order (two writers lock in the
    same order: no deadlock): per span, the range of its starts (a batch spans a second
    or so: a bucket or two), kept when their key is one of ``added``'s."""
    found = []
    for span in sorted({key[0] for key in added}):
        keys = [key for key in added if key[0] == span]
        rows = manager.select_for_update().filter(
            span=span,
            start__gte=min(key[1] for key in keys),
            start__lte=max(key[1] for key in keys),
            alias__in={key[2] for key in keys},
            prefix__in={key[3] for key in keys},
        )
        found += [r for r in rows.order_by("start", "alias", "prefix") if _key(r) in added]
    return found


def _key(row: Any) -> Key:
    return (row.span, row.start, row.alias, row.prefix)


def store(added: Mapping[Key, Counts], using: str | None = None, model: Any = None) -> None:
    """Add ``added`` to the bucket rows, in one transaction: the rows that exist are
    read locked and updated, the others inserted. When another writer inserted one of
    these meanwhile (a unique violation), or the database refused the transaction (a
    deadlock: InnoDB's between writers inserting the same new rows), the batch is tried
    again (:data:`_ATTEMPTS`, a few milliseconds apart).
    ``model``: a migration's historical LockActivity.
    """
    if not added:
        return
    model = LockActivity if model is None else model
    manager = model.objects.db_manager(using)
    backoff = Backoff(base=0.005, cap=0.05)
    for attempt in range(_ATTEMPTS):
        try:
            with transaction.atomic(using=manager.db):
                connection = connections[manager.db]
                if connection.vendor == "sqlite":
                    # Take the write lock first (waiting for it, busy timeout): a read
                    # transaction that later writes fails at once when another wrote.
                    with connection.cursor() as cursor:
                        cursor.execute(f"UPDATE {model._meta.db_table} SET span = span WHERE 0")
                rows = _existing(manager, added)
                seen = set()
                for row in rows:
                    seen.add(_key(row))
                    added[_key(row)].merge_into(row)
                manager.bulk_update(rows, _FIELDS, batch_size=500)
                manager.bulk_create(
                    [
                        model(span=k[0], start=k[1], alias=k[2], prefix=k[3], **vars(c))
                        for k, c in sorted(added.items())
                        if k not in seen
                    ],
                    batch_size=1000,
                )
            return
        except (IntegrityError, OperationalError) as exc:
            if attempt == _ATTEMPTS - 1 or not (
                isinstance(exc, IntegrityError) or transaction_refused(exc)
            ):
                raise
            time.sleep(backoff.next_delay())


def add_events(events: Iterable[Mapping[str, Any]], using: str | None = None) -> None:
    """Count ``events`` (dicts of LockEvent fields) in the bucket rows.

    :param events: the events written (or being written) to the audit trail.
    :param using: the database alias (default: the router's for LockActivity).
    :raises DatabaseError: when the database fails (nothing is added then).
    """
    store(collect(events), using)
