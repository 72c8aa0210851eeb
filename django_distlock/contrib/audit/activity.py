"""The activity page: lock events of a window as charts, per alias and per name prefix.

It reads the pre-aggregated buckets (:mod:`django_distlock.contrib.audit.buckets`): at most
``buckets x (alias, prefix)`` rows whatever the size of the audit trail, and the wait and
hold histograms of the :data:`SHOWN` busiest groups only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.utils import timezone

from django_distlock.exceptions import InvalidLockName
from django_distlock.values import validate_page_args

from . import buckets, totals
from .charts import row_bars, time_bars
from .models import LockActivity, LockEvent

#: Window name -> (length, number of buckets); each bucket is one of ``buckets.SPANS``.
WINDOWS = {
    "1h": (timedelta(hours=1), 60),
    "6h": (timedelta(hours=6), 72),
    "24h": (timedelta(hours=24), 96),
    "7d": (timedelta(days=7), 84),
}
#: Groups (alias, name prefix) whose wait and hold percentiles the page shows: the busiest.
SHOWN = 20
#: Most events read for one page when a search reaches past a name's first ``:`` (the
#: buckets count per name prefix; such a search reads the events, the newest first).
MAX_EVENTS = 200_000
SERIES = [
    ("acquired", "Acquisitions", "#417690"),
    ("failed", "Timeouts / busy", "#c58a00"),
    ("lost", "Expired or lost leases", "#ba2121"),
    ("forced", "Force releases", "#6f42c1"),
]
KINDS = [kind for kind, _, _ in SERIES]


@dataclass
class Group:
    """One (alias, name prefix) row of the page: its counts and wait/hold histograms."""

    alias: str
    prefix: str
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    waits: dict[str, int] = field(default_factory=dict)
    holds: dict[str, int] = field(default_factory=dict)

    def stats(self) -> dict[str, float | None]:
        """Wait and hold p50/p95/p99 (upper bounds of their histogram buckets)."""
        return {
            f"{what}_p{int(q * 100)}": buckets.percentile(values, q)
            for what, values in (("wait", self.waits), ("hold", self.holds))
            for q in (0.5, 0.95, 0.99)
        }


def summarize(
    rows: Iterable[Any], since: datetime, span: int, count: int
) -> tuple[dict[str, list[int]], list[Group]]:
    """Return counts per kind per bucket and the (alias, name prefix) groups of ``rows``."""
    series = {kind: [0] * count for kind in KINDS}
    groups: dict[tuple[str, str], Group] = {}
    for row in rows:
        index = int((row.start - since).total_seconds()) // span
        key = (row.alias, row.prefix)
        group = groups.get(key) or groups.setdefault(key, Group(*key))
        for kind in KINDS:
            value = getattr(row, kind)
            if 0 <= index < count:
                series[kind][index] += value
            group.counts[kind] += value
        for mine, theirs in ((group.waits, row.waits), (group.holds, row.holds)):
            for slot, n in theirs.items():
                mine[slot] = mine.get(slot, 0) + n
    ordered = sorted(groups.values(), key=lambda g: -sum(g.counts.values()))
    return series, ordered


def by_prefix(prefix: str) -> bool:
    """Whether the buckets (per name prefix) answer a search for names starting with
    ``prefix``: when it has no ``:`` but maybe a last one."""
    return ":" not in prefix[:-1]


def from_buckets(
    span: int, since: datetime, count: int, alias: str, prefix: str
) -> tuple[dict[str, list[int]], list[Group]]:
    """Counts per kind per bucket and the groups of a window, summed by the database
    from the bucket rows (:mod:`django_distlock.contrib.audit.totals`: four queries).

    :param span: the window's bucket length, seconds.
    :param since: the start of its first bucket.
    :param count: its number of buckets.
    :param alias: only this alias ("": every one).
    :param prefix: only names starting with this (:func:`by_prefix` must be true).
    :returns: the series and the groups, the busiest first; only the first
        :data:`SHOWN` have their wait and hold histograms (the others' are empty).
    """
    rows = LockActivity.objects.filter(span=span, start__gte=since)
    if alias:
        rows = rows.filter(alias=alias)
    if prefix:
        rows = rows.filter(prefix__startswith=prefix)
    starts, counts, waits, holds = totals.window(rows, SHOWN)
    series = {kind: [0] * count for kind in KINDS}
    for start, sums in starts:
        index = int((start - since).total_seconds()) // span
        if 0 <= index < count:
            for kind in KINDS:
                series[kind][index] += sums[kind]
    groups = [
        Group(alias, prefix, defaultdict(int, sums), waits.get((alias, prefix), {}),
              holds.get((alias, prefix), {}))
        for (alias, prefix), sums in ((key, counts[key]) for key in totals.busiest(counts))
    ]  # fmt: skip
    return series, groups


def from_events(
    span: int, since: datetime, count: int, alias: str, prefix: str
) -> tuple[dict[str, list[int]], list[Group], bool]:
    """Like :func:`from_buckets`, from the events themselves (a search past a name's
    first ``:``, which the buckets cannot answer): at most :data:`MAX_EVENTS`, the
    newest; the last item says whether some were left out."""
    events = LockEvent.objects.filter(at__gte=since, name__startswith=prefix)
    if alias:
        events = events.filter(alias=alias)
    fields = ("at", "kind", "alias", "name", "waited", "held", "acquired_at")
    found = list(events.order_by("-at").values(*fields)[:MAX_EVENTS])
    rows = [
        LockActivity(span=k[0], start=k[1], alias=k[2], prefix=k[3], **vars(c))
        for k, c in buckets.collect(found).items()
        if k[0] == span and k[1] >= since
    ]
    return *summarize(rows, since, span, count), len(found) == MAX_EVENTS


def can_view(request: HttpRequest) -> bool:
    """Whether the user may see the activity page: the audit trail's view permission, or
    the held-locks pages' (the admin app's, named by its string)."""
    user = request.user
    return user.has_perm("distlock_audit.view_lockevent") or user.has_perm(
        "distlock_admin.view_held_lock"
    )


def activity_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """Charts of the audit trail over a window, filtered by alias and name prefix."""
    if not can_view(request):
        raise PermissionDenied
    window, alias = request.GET.get("window", "24h"), request.GET.get("alias", "")
    prefix = request.GET.get("q", "")
    if window not in WINDOWS:
        return HttpResponseBadRequest(f"Bad request: window must be one of {', '.join(WINDOWS)}.")
    try:
        validate_page_args(prefix, 1, None)
    except (InvalidLockName, ValueError) as exc:
        return HttpResponseBadRequest(f"Bad request: search: {exc}")
    if len(alias) > 100:
        return HttpResponseBadRequest("Bad request: alias is too long.")
    length, count = WINDOWS[window]
    span = int(length.total_seconds()) // count
    since = buckets.bucket_start(timezone.now(), span) + timedelta(seconds=span) - length
    if by_prefix(prefix):
        series, groups = from_buckets(span, since, count, alias, prefix)
        truncated = False
    else:
        series, groups, truncated = from_events(span, since, count, alias, prefix)
    labels = [
        timezone.localtime(since + timedelta(seconds=span * i)).strftime("%b %d %H:%M")
        for i in range(count)
    ]
    stats = [(g, g.stats()) for g in groups[:SHOWN]]
    charts = [time_bars(title, series[kind], labels, color) for kind, title, color in SERIES]

    def ms(value: float | None) -> float:
        return 0.0 if value is None else value * 1000

    label = [f"{g.alias} {g.prefix}" for g, _ in stats]
    context = {
        **site.each_context(request),
        "title": "Lock activity",
        "is_nav_sidebar_enabled": False,
        "charts": charts,
        "wait_chart": row_bars(
            "Wait p95 per alias and name prefix",
            [(lab, ms(s["wait_p95"])) for lab, (_, s) in zip(label, stats, strict=True)],
            "ms",
            "#c58a00",
        ),
        "hold_chart": row_bars(
            "Hold p95 per alias and name prefix",
            [(lab, ms(s["hold_p95"])) for lab, (_, s) in zip(label, stats, strict=True)],
            "ms",
            "#417690",
        ),
        "stats": stats,
        "window": window,
        "windows": list(WINDOWS),
        "alias": alias,
        "q": prefix,
        "truncated": truncated,
        "total": sum(sum(values) for kind, values in series.items() if kind != "lost"),
    }
    return TemplateResponse(request, "admin/distlock_audit/activity.html", context)
