"""The activity page: lock events of a window as charts, per alias and per name prefix."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.utils import timezone

from ..exceptions import InvalidLockName
from ..models import LockEvent
from ..values import validate_page_args
from .charts import row_bars, time_bars

#: Window name -> (length, number of buckets).
WINDOWS = {
    "1h": (timedelta(hours=1), 60),
    "6h": (timedelta(hours=6), 72),
    "24h": (timedelta(hours=24), 96),
    "7d": (timedelta(days=7), 84),
}
#: Most events read for one page (the newest): bounds the page's cost on a busy trail.
MAX_EVENTS = 200_000
SERIES = [
    (LockEvent.ACQUIRED, "Acquisitions", "#417690"),
    (LockEvent.FAILED, "Timeouts / busy", "#c58a00"),
    (LockEvent.LOST, "Expired or lost leases", "#ba2121"),
    (LockEvent.FORCE_RELEASED, "Force releases", "#6f42c1"),
]


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of ``values`` (sorted), or None when empty."""
    if not values:
        return None
    return values[max(0, math.ceil(fraction * len(values)) - 1)]


def name_prefix(name: str) -> str:
    """The group of a name on the page: up to its first ``:`` (``order:42`` -> ``order:``)."""
    head, sep, _ = name.partition(":")
    return head + sep if sep else name


@dataclass
class Group:
    alias: str
    prefix: str
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    waits: list[float] = field(default_factory=list)
    holds: list[float] = field(default_factory=list)

    def stats(self) -> dict[str, float | None]:
        waits, holds = sorted(self.waits), sorted(self.holds)
        return {
            f"{what}_p{int(q * 100)}": percentile(values, q)
            for what, values in (("wait", waits), ("hold", holds))
            for q in (0.5, 0.95, 0.99)
        }


Event = tuple[datetime, str, str, str, float | None, float | None]


def summarize(
    events: list[Event], since: datetime, length: timedelta, buckets: int
) -> tuple[dict[str, list[int]], list[Group]]:
    """Return counts per kind per bucket and the (alias, name prefix) groups of ``events``."""
    series = {kind: [0] * buckets for kind, _, _ in SERIES}
    groups: dict[tuple[str, str], Group] = {}
    width = length / buckets
    for at, kind, alias, name, waited, held in events:
        index = min(int((at - since) / width), buckets - 1)
        if kind in series and index >= 0:
            series[kind][index] += 1
        key = (alias, name_prefix(name))
        group = groups.get(key) or groups.setdefault(key, Group(*key))
        group.counts[kind] += 1
        if waited is not None and kind == LockEvent.ACQUIRED:
            group.waits.append(waited)
        if held is not None and kind in (LockEvent.RELEASED, LockEvent.LOST):
            group.holds.append(held)
    return series, sorted(groups.values(), key=lambda g: -sum(g.counts.values()))


def activity_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """Charts of the audit trail over a window, filtered by alias and name prefix."""
    user = request.user
    if not (
        user.has_perm("django_distlock.view_lockevent")
        or user.has_perm("django_distlock.view_held_lock")
    ):
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
    length, buckets = WINDOWS[window]
    now = timezone.now()
    since = now - length
    events = LockEvent.objects.filter(at__gte=since, at__lte=now)
    if alias:
        events = events.filter(alias=alias)
    if prefix:
        events = events.filter(name__startswith=prefix)
    rows = list(
        events.order_by("-at").values_list("at", "kind", "alias", "name", "waited", "held")[
            :MAX_EVENTS
        ]
    )
    series, groups = summarize(rows, since, length, buckets)
    labels = [
        timezone.localtime(since + length * i / buckets).strftime("%b %d %H:%M")
        for i in range(buckets)
    ]
    stats = [(g, g.stats()) for g in groups[:20]]
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
        "truncated": len(rows) == MAX_EVENTS,
        "total": len(rows),
    }
    return TemplateResponse(request, "admin/django_distlock/activity.html", context)
