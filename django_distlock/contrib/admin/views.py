"""The held-locks pages of the admin: list, detail, force release (with confirmation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from django_distlock.backends.base import COUNT_CAP
from django_distlock.backends.shared_reads import shared_reads
from django_distlock.exceptions import DistLockError, InvalidLockName, LockConfigurationError
from django_distlock.handler import locks
from django_distlock.names import validate_name
from django_distlock.values import LockInfo, validate_page_args

from .operations.listing import (
    BadPosition,
    Page,
    Position,
    Row,
    backend_label,
    find_lock,
    read_page,
    sign_position,
    sign_trail,
    unsign_position,
    unsign_trail,
)
from .operations.ordered import read_merged, sign_merged, unsign_merged
from .operations.release import release_audited
from .operations.totals import count_totals, grand_total
from .operations.waiting import waiter_dict, who_waits

VIEW_PERM = "distlock_admin.view_held_lock"
RELEASE_PERM = "distlock_admin.force_release_lock"
PAGE_SIZE = 50
#: Where each alias' count of held locks stops ("at least" past it): the cost of a count.
COUNT_LIMIT = COUNT_CAP
#: Seconds between the page's reloads while auto-refresh is on (``?refresh=0``: off).
REFRESH = 10
SORTS = {
    "acquired": lambda row: row.info.acquired_at or timezone.now(),
    "expires": lambda row: row.info.expires_at or timezone.now(),
}


def can_view(request: HttpRequest) -> bool:
    return request.user.has_perm(VIEW_PERM) or request.user.has_perm(RELEASE_PERM)


def _check_view(request: HttpRequest) -> None:
    if not can_view(request):
        raise PermissionDenied


def _lock_arg(request: HttpRequest, data: Any) -> tuple[str, str]:
    """Return the (alias, name) a request names: 404 for an unknown alias, 400 for a bad name."""
    alias, name = data.get("alias", ""), data.get("name", "")
    if alias not in locks:
        raise Http404(f"No lock alias {alias!r} is configured.")
    try:
        locks[alias]
    except LockConfigurationError as exc:
        raise _BadRequest(f"the alias {alias!r} is misconfigured: {exc}") from exc
    try:
        validate_name(name)
    except (InvalidLockName, ValueError, TypeError) as exc:
        raise _BadRequest(str(exc)) from exc
    return alias, name


class _BadRequest(Exception):
    """A query argument that the page cannot use; answered with a 400 saying why."""


def _bad_request(message: str) -> HttpResponse:
    return HttpResponseBadRequest(f"Bad request: {message}", content_type="text/plain")


def _page_url(query: dict[str, str], cursor: str = "", back: str = "") -> str:
    """The querystring of a page of the same filter, sort and refresh setting."""
    args = {key: value for key, value in query.items() if value}
    if cursor:
        args["cursor"] = cursor
    if back:
        args["back"] = back
    return "?" + urlencode(args)


def _positions(
    request: HttpRequest, query: tuple[str, str]
) -> tuple[Position | None, list[Position | None]]:
    """The page's position and the positions of the pages before it, from the URL."""
    position = None
    if "cursor" in request.GET:
        position = unsign_position(request.GET["cursor"], query)
    trail = unsign_trail(request.GET["back"], query) if "back" in request.GET else []
    return position, trail


#: The merged orders across aliases (``?by=``): held longest first, expiring soonest.
ORDERS = {"acquired": "held longest first", "expires": "expiring soonest first"}


class _Listing:
    """What the table shows and the page links of one page, name order or merged."""

    def __init__(self, rows: list[Row], states: list[Any], first: bool) -> None:
        self.rows, self.states, self.is_first = rows, states, first
        self.next_url = self.prev_url = ""
        self.left_out: list[tuple[str, str, str]] = []

    def link(self, kept: dict[str, str], position: Any, next_position: Any, trail: list[Any],
             sign: Callable[[Any], str], sign_trail: Callable[[list[Any]], str]) -> None:
        """Set the next and previous pages' URLs (``sign``: a position's URL value,
        ``sign_trail``: the earlier positions')."""
        if next_position is not None:
            self.next_url = _page_url(kept, sign(next_position), sign_trail([*trail, position]))
        if trail:
            before = trail[-1]
            self.prev_url = _page_url(
                kept,
                sign(before) if before is not None else "",
                sign_trail(trail[:-1]) if trail[:-1] else "",
            )


def _by_reason(left_out: list[tuple[str, str, str]]) -> list[tuple[str, list[str]]]:
    """The aliases left out of the merged order, grouped by reason (one banner each)."""
    groups: dict[str, list[str]] = {}
    for alias, label, reason in left_out:
        groups.setdefault(f"{label}: {reason}", []).append(alias)
    return list(groups.items())


def _name_order(request: HttpRequest, aliases: list[str], kept: dict[str, str]) -> _Listing:
    """A page of each alias in turn, names in key order (``Page``)."""
    query = (kept["alias"], kept["q"])
    position, trail = _positions(request, query)
    page: Page = read_page(aliases, kept["q"], PAGE_SIZE, position)
    listing = _Listing(page.rows, page.aliases, position is None)
    listing.link(kept, position, page.next_position, trail,
                 lambda p: sign_position(p, query), lambda t: sign_trail(t, query))
    return listing


def _merged_order(request: HttpRequest, aliases: list[str], kept: dict[str, str]) -> _Listing:
    """A page of the aliases merged in an age order (``operations.ordered``)."""
    query = (kept["alias"], kept["q"], kept["by"])
    position = unsign_merged(request.GET["cursor"], query)[0] if "cursor" in request.GET else None
    trail = unsign_merged(request.GET["back"], query) if "back" in request.GET else []
    page = read_merged(aliases, kept["q"], kept["by"], PAGE_SIZE, position)
    listing = _Listing(page.rows, page.aliases, position is None)
    listing.left_out = page.left_out
    listing.link(kept, position, page.next_position, trail,
                 lambda p: sign_merged([p], query), lambda t: sign_merged(t, query))
    return listing


def held_locks_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """The table of held locks across the aliases (totals, filter, prefix search, previous
    and next pages, each alias in turn or merged by age, sort within the page,
    auto-refresh)."""
    _check_view(request)
    alias, prefix = request.GET.get("alias", ""), request.GET.get("q", "")
    sort, refresh = request.GET.get("o", ""), request.GET.get("refresh", "")
    by = request.GET.get("by", "")
    if alias and alias not in locks:
        raise Http404(f"No lock alias {alias!r} is configured.")
    if sort.lstrip("-") not in ("", *SORTS):
        return _bad_request(f"unknown sort {sort!r}; use acquired or expires, '-' for descending.")
    if by not in ("", *ORDERS):
        return _bad_request(f"unknown order {by!r}; use acquired or expires.")
    if refresh not in ("", "0", str(REFRESH)):
        return _bad_request(f"refresh is 0 (off) or {REFRESH} (seconds), got {refresh!r}.")
    try:
        validate_page_args(prefix, 1, None)
    except (InvalidLockName, ValueError) as exc:
        return _bad_request(f"search: {exc}")
    aliases = [alias] if alias else list(locks)
    kept = {"alias": alias, "q": prefix, "by": by, "o": sort, "refresh": refresh}
    # One view, one read of what a backend reads whole (ZooKeeper's lock parents): the
    # page and the totals share it, and agree.
    with shared_reads():
        try:
            listing = (_merged_order if by else _name_order)(request, aliases, kept)
        except BadPosition as exc:
            return _bad_request(str(exc))
        # Filtered to one alias: only its count (each count costs the page its time).
        totals = count_totals(aliases, prefix, COUNT_LIMIT)
    rows: list[Row] = listing.rows
    if sort:
        rows = sorted(rows, key=SORTS[sort.lstrip("-")], reverse=sort.startswith("-"))
    context = {
        **site.each_context(request),
        "title": "Held locks",
        "is_nav_sidebar_enabled": False,  # the table needs the width
        "rows": rows,
        "alias_states": listing.states,
        "all_aliases": list(locks),
        "totals": totals,
        "grand_total": grand_total(totals),
        "alias": alias,
        "q": prefix,
        "sort": sort,
        "by": by,
        "orders": ORDERS,
        "left_out": _by_reason(listing.left_out),
        "refresh": refresh,
        "refresh_seconds": REFRESH,
        "next_url": listing.next_url,
        "prev_url": listing.prev_url,
        "first_url": _page_url(kept),
        "sort_url": _page_url({"alias": alias, "q": prefix, "by": by, "refresh": refresh}),
        "order_url": _page_url({"alias": alias, "q": prefix, "refresh": refresh}),
        "is_first_page": listing.is_first,
        "can_release": request.user.has_perm(RELEASE_PERM),
        "now": timezone.now(),
    }
    return TemplateResponse(request, "admin/distlock_admin/held_locks.html", context)


def _info_or_error(alias: str, name: str) -> tuple[LockInfo | None, str]:
    if not locks[alias].supports_listing:
        return None, f"The alias {alias!r} cannot list its locks."
    try:
        return find_lock(alias, name), ""
    except DistLockError as exc:
        return None, f"{alias}: {exc}"


def lock_detail_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """One held lock: its holder, times, fencing token, waiters."""
    _check_view(request)
    try:
        alias, name = _lock_arg(request, request.GET)
    except _BadRequest as exc:
        return _bad_request(str(exc))
    info, error = _info_or_error(alias, name)
    backend = locks[alias]
    waiting = who_waits(alias, name) if info is not None else None
    context = {
        **site.each_context(request),
        "title": f"Lock {name}",
        "alias": alias,
        "name": name,
        "info": info,
        "error": error,
        "backend_type": type(backend).__name__,
        "backend_label": backend_label(backend),
        "now": timezone.now(),
        "can_release": request.user.has_perm(RELEASE_PERM) and backend.supports_force_release,
        "waiting": waiting,
        "waiter_rows": [waiter_dict(w) for w in waiting.waiters] if waiting else [],
    }
    return TemplateResponse(request, "admin/distlock_admin/held_lock_detail.html", context)


class ForceReleaseForm(forms.Form):
    alias = forms.CharField(widget=forms.HiddenInput)
    name = forms.CharField(widget=forms.HiddenInput)
    # The holder the page showed: the release is refused if someone else holds it now.
    owner = forms.CharField(widget=forms.HiddenInput, required=False)
    fencing_token = forms.IntegerField(widget=forms.HiddenInput, required=False)
    # A holder listed without an owner id (MySQL session mode) is told apart by who it is
    # and when it was granted.
    holder = forms.CharField(widget=forms.HiddenInput, required=False)
    acquired_at = forms.DateTimeField(widget=forms.HiddenInput, required=False)
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), max_length=2000)


#: Seconds apart two listings may place one grant's time (MySQL session mode computes it
#: from the holder session's idle time: two reads differ by a few milliseconds, more on a
#: loaded server). A holder listed without an owner id that was granted less than this
#: after the one a page showed is taken for it.
SAME_GRANT_WITHIN = 0.5


def holder_of(info: LockInfo) -> str:
    """Who holds, as a confirmation page keeps it: host, process, thread and context."""
    return f"{info.host}|{info.pid}|{info.thread}|{info.context}"


def same_holder(shown: dict[str, Any], now: LockInfo) -> bool:
    """Whether the lock is held now by the holder a page showed: the same owner id and
    fencing token; with no owner id listed, also the same holder, granted at the same
    time."""
    if shown["owner"] != now.owner or shown["fencing_token"] != now.fencing_token:
        return False
    if now.owner:
        return True
    then = shown.get("acquired_at")
    if then is None or now.acquired_at is None:
        same_time = then is None and now.acquired_at is None
    else:
        same_time = abs((now.acquired_at - then).total_seconds()) <= SAME_GRANT_WITHIN
    return shown.get("holder", "") == holder_of(now) and same_time


@require_http_methods(["GET", "POST"])
def force_release_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """GET: the confirmation page with a reason field. POST: release if still the same holder."""
    if not request.user.has_perm(RELEASE_PERM):
        raise PermissionDenied
    data = request.POST if request.method == "POST" else request.GET
    try:
        alias, name = _lock_arg(request, data)
    except _BadRequest as exc:
        return _bad_request(str(exc))
    backend = locks[alias]
    if not backend.supports_force_release:
        return _bad_request(f"the alias {alias!r} ({type(backend).__name__}) cannot force-release.")
    info, error = _info_or_error(alias, name)
    list_url = reverse(f"{site.name}:django_distlock_held_locks")
    status = 200
    if request.method == "POST":
        form = ForceReleaseForm(request.POST)
        if form.is_valid():
            if info is None:
                messages.warning(request, error or f"{name} on {alias} is no longer held.")
                return redirect(list_url)
            if not same_holder(form.cleaned_data, info):
                status = 409
                error = (
                    f"{name} on {alias} is held now by another holder (owner "
                    f"{info.owner or '-'}, fencing token {info.fencing_token}, {info.host} pid "
                    f"{info.pid} {info.thread}, since {info.acquired_at}) than the one "
                    "shown; not released."
                )
            else:
                reason, actor = form.cleaned_data["reason"], request.user.get_username()
                freed = release_audited(name, info, actor, reason)
                if freed:
                    messages.success(request, f"Released {name} on {alias}.")
                else:
                    messages.warning(
                        request,
                        f"{name} on {alias} was freed, or taken by another holder, before the "
                        "release; not released.",
                    )
                return redirect(list_url)
    else:
        form = ForceReleaseForm(
            initial={
                "alias": alias,
                "name": name,
                "owner": info.owner if info else "",
                "fencing_token": info.fencing_token if info else None,
                "holder": holder_of(info) if info else "",
                "acquired_at": info.acquired_at if info else None,
            }
        )
    context = {
        **site.each_context(request),
        "title": f"Force-release {name}?",
        "alias": alias,
        "name": name,
        "info": info,
        "error": error,
        "form": form,
    }
    return TemplateResponse(
        request, "admin/distlock_admin/force_release.html", context, status=status
    )
