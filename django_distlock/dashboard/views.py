"""The held-locks pages of the admin: list, detail, force release (with confirmation)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from ..exceptions import DistLockError, InvalidLockName, LockConfigurationError
from ..handler import locks
from ..names import validate_name
from ..operations.listing import (
    BadPosition,
    Page,
    Row,
    find_lock,
    read_page,
    sign_position,
    unsign_position,
)
from ..operations.release import release_audited
from ..operations.waiting import waiter_dict, who_waits
from ..values import LockInfo, validate_page_args

VIEW_PERM = "django_distlock.view_held_lock"
RELEASE_PERM = "django_distlock.force_release_lock"
PAGE_SIZE = 50
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


def held_locks_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """The table of held locks across the aliases (filter, prefix search, page, sort)."""
    _check_view(request)
    alias, prefix = request.GET.get("alias", ""), request.GET.get("q", "")
    sort = request.GET.get("o", "")
    if alias and alias not in locks:
        raise Http404(f"No lock alias {alias!r} is configured.")
    if sort.lstrip("-") not in ("", *SORTS):
        return _bad_request(f"unknown sort {sort!r}; use acquired or expires, '-' for descending.")
    try:
        validate_page_args(prefix, 1, None)
    except (InvalidLockName, ValueError) as exc:
        return _bad_request(f"search: {exc}")
    query = (alias, prefix)
    position = None
    if "cursor" in request.GET:
        try:
            position = unsign_position(request.GET["cursor"], query)
        except BadPosition as exc:
            return _bad_request(str(exc))
    aliases = [alias] if alias else list(locks)
    try:
        page: Page = read_page(aliases, prefix, PAGE_SIZE, position)
    except BadPosition as exc:
        return _bad_request(str(exc))
    rows: list[Row] = page.rows
    if sort:
        rows = sorted(rows, key=SORTS[sort.lstrip("-")], reverse=sort.startswith("-"))
    next_cursor = None
    if page.next_position is not None:
        next_cursor = sign_position(page.next_position, query)
    context = {
        **site.each_context(request),
        "title": "Held locks",
        "is_nav_sidebar_enabled": False,  # the table needs the width
        "rows": rows,
        "alias_states": page.aliases,
        "all_aliases": list(locks),
        "alias": alias,
        "q": prefix,
        "sort": sort,
        "next_cursor": next_cursor,
        "is_first_page": position is None,
        "can_release": request.user.has_perm(RELEASE_PERM),
        "now": timezone.now(),
    }
    return TemplateResponse(request, "admin/django_distlock/held_locks.html", context)


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
        "can_release": request.user.has_perm(RELEASE_PERM) and backend.supports_force_release,
        "waiting": waiting,
        "waiter_rows": [waiter_dict(w) for w in waiting.waiters] if waiting else [],
    }
    return TemplateResponse(request, "admin/django_distlock/held_lock_detail.html", context)


class ForceReleaseForm(forms.Form):
    alias = forms.CharField(widget=forms.HiddenInput)
    name = forms.CharField(widget=forms.HiddenInput)
    # The holder the page showed: the release is refused if someone else holds it now.
    owner = forms.CharField(widget=forms.HiddenInput, required=False)
    fencing_token = forms.IntegerField(widget=forms.HiddenInput, required=False)
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), max_length=2000)


def same_holder(shown: dict[str, Any], now: LockInfo) -> bool:
    """Whether the lock is held now by the holder a page showed (owner id and fencing token)."""
    return shown["owner"] == now.owner and shown["fencing_token"] == now.fencing_token


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
                    f"{name} on {alias} is held now by another holder (owner {info.owner}, "
                    f"fencing token {info.fencing_token}) than the one shown; not released."
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
        request, "admin/django_distlock/force_release.html", context, status=status
    )
