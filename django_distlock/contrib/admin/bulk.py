"""The admin's bulk release: choose a host, process, owner or name prefix, see the locks
that will be freed, confirm with a reason.

The preview signs what it showed (the locks with their owner ids, the criteria, the
user, the time) into the confirmation form; the POST frees only those locks, each
while the owner shown still holds it (:func:`..operations.bulk.release_selected`).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from django_distlock.exceptions import InvalidLockName
from django_distlock.handler import locks
from django_distlock.values import LockInfo

from .operations.bulk import (
    MAX_PER_ACTION,
    Outcome,
    Preview,
    Selection,
    release_selected,
    select,
)

RELEASE_PERM = "distlock_admin.force_release_lock"
SALT = "django_distlock.dashboard.bulk_release"
#: Seconds a preview may be confirmed in; later, the operator previews again.
MAX_AGE = 15 * 60
#: Most locks one confirmation frees: they are freed within the request, one round trip
#: each (measured: 0.3 ms a lock on Redis, 3 ms on ZooKeeper), so that a confirmation
#: stays well within a worker's timeout. The command frees up to MAX_PER_ACTION a run.
ADMIN_MAXIMUM = 1_000


class CriteriaForm(forms.Form):
    """What to free: every given criterion must match."""

    alias = forms.CharField(required=False)
    host = forms.CharField(required=False, max_length=255)
    pid = forms.IntegerField(required=False, min_value=0)
    owner = forms.CharField(required=False, max_length=16, label="Owner id")
    q = forms.CharField(required=False, max_length=255, label="Name starts with")

    def clean_alias(self) -> str:
        alias: str = self.cleaned_data["alias"]
        if alias and alias not in locks:
            raise forms.ValidationError(f"No lock alias {alias!r} is configured.")
        return alias

    def selection(self) -> Selection:
        """The criteria as a Selection; raise ValidationError when they select nothing."""
        data = self.cleaned_data
        try:
            return Selection(
                host=data["host"].strip(), pid=data["pid"], owner=data["owner"].strip(),
                prefix=data["q"],
            )
        except (ValueError, TypeError, InvalidLockName) as exc:
            raise forms.ValidationError(str(exc)) from exc


class ConfirmForm(forms.Form):
    shown = forms.CharField(widget=forms.HiddenInput)
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), max_length=2000)


def sign_preview(request: HttpRequest, selection: Selection, preview: Preview) -> str:
    """The signed form value of what a preview showed, bound to the user (expires)."""
    rows = [[i.alias, i.name, i.owner, i.fencing_token, i.host, i.pid] for i in preview.locks]
    criteria = [selection.host, selection.pid, selection.owner, selection.prefix]
    return signing.dumps([request.user.pk, criteria, rows], salt=SALT, compress=True)


def unsign_preview(request: HttpRequest, value: str) -> tuple[Selection, list[LockInfo]]:
    """Return the selection and the locks a confirmation form carries.

    :raises signing.BadSignature: when it is forged, expired, or another user's.
    """
    user, criteria, rows = signing.loads(value, salt=SALT, max_age=MAX_AGE)
    if user != request.user.pk:
        raise signing.BadSignature("This confirmation was made for another user.")
    host, pid, owner, prefix = criteria
    selection = Selection(host=host, pid=pid, owner=owner, prefix=prefix)
    targets = [
        LockInfo(alias, name, owner, token, None, None, host, pid, "")
        for alias, name, owner, token, host, pid in rows
    ]
    return selection, targets


def _report(request: HttpRequest, selection: Selection, outcome: Outcome) -> None:
    what = selection.describe()
    count = len(outcome.freed)
    messages.success(request, f"Released {count} lock{'s' if count != 1 else ''} ({what}).")
    gone = [info for info, why in outcome.skipped if why.startswith("no longer")]
    if gone:
        messages.warning(
            request,
            f"{len(gone)} not released: freed, or taken by another holder, since the preview.",
        )
    other = len(outcome.skipped) - len(gone)
    if other:
        messages.error(request, f"{other} not released (see the audit trail for why).")


@require_http_methods(["GET", "POST"])
def bulk_release_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """GET: the criteria form, and with criteria the preview and the confirmation form.
    POST: free the locks the signed preview showed, each only while held by the owner shown."""
    if not request.user.has_perm(RELEASE_PERM):
        raise PermissionDenied
    list_url = reverse(f"{site.name}:django_distlock_held_locks")
    if request.method == "POST":
        confirm = ConfirmForm(request.POST)
        if not confirm.is_valid():
            return HttpResponseBadRequest("Bad request: a reason is required.",
                                          content_type="text/plain")
        try:
            selection, targets = unsign_preview(request, confirm.cleaned_data["shown"])
        except (signing.BadSignature, ValueError, TypeError) as exc:
            return HttpResponseBadRequest(
                f"Bad request: this confirmation is not valid ({exc}); preview again.",
                content_type="text/plain",
            )
        outcome = release_selected(
            targets, selection, request.user.get_username(), confirm.cleaned_data["reason"]
        )
        _report(request, selection, outcome)
        return redirect(list_url)
    criteria = CriteriaForm(request.GET or None)
    context: dict[str, Any] = {
        **site.each_context(request),
        "title": "Bulk release",
        "criteria": criteria,
        "is_nav_sidebar_enabled": False,  # the table needs the width
        "maximum": f"{ADMIN_MAXIMUM:,}",
        "command_maximum": f"{MAX_PER_ACTION:,}",
        "all_aliases": list(locks),
    }
    if criteria.is_bound and criteria.is_valid():
        try:
            selection = criteria.selection()
        except forms.ValidationError as exc:
            criteria.add_error(None, exc)
        else:
            alias = criteria.cleaned_data["alias"]
            preview = select(selection, [alias] if alias else None, maximum=ADMIN_MAXIMUM)
            context.update(
                selection=selection,
                preview=preview,
                confirm=ConfirmForm(
                    initial={"shown": sign_preview(request, selection, preview)}
                ),
            )
    return TemplateResponse(request, "admin/distlock_admin/bulk_release.html", context)
