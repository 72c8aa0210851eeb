"""Concurrent-edit detection in the Django admin for optimistic-locking models.

Put :class:`OptimisticAdminMixin` before ``admin.ModelAdmin``. Every page that
lets a user change rows carries what each row was read at: its version and
the values of the fields on the page, signed with :mod:`django.core.signing`
(salt bound to the model and the primary key):

- the change form, in a hidden field;
- the ``list_editable`` changelist, in a hidden input rendered with each row's
  primary key;
- the action checkboxes: an action on a selection holding a row changed since
  the list was shown is not run.

When a form comes back for a row that someone else changed meanwhile, the
three versions are compared field by field: what was read (signed), what the
editor posted, what the row holds now. Nothing of the editor's to save: no
write. Nothing on the form changed by the other: the editor's values are
saved on top of the row as it is now. Otherwise nothing is saved and the
form (or the row of the list) is shown again with the current values and the
editor's own changes kept; where both changed a field, the editor's value
stays in the input and the other's is shown beside it.

The saves themselves are checked ``UPDATE ... WHERE version = <signed>``
(see :mod:`django_distlock.contrib.optimistic`), so a write landing between the
check and the save is refused too. See ``docs/optimistic-admin.md``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets
from django.core import checks, signing
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import models, router, transaction
from django.forms.models import BaseModelFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.csrf import csrf_protect

from django_distlock.exceptions import VersionConflict

from .admin_forms import (
    ACTION_VERSION_PREFIX,
    VERSION_FORM_FIELD,
    Merge,
    OptimisticChangelistFormSet,
    OptimisticFormMixin,
    SignedRead,
    sign_version,
    unsign_version,
)
from .admin_selection import SelectionCheck, quoted, these
from .version import version_field

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

    _AdminBase = ModelAdmin[Any]
else:
    _AdminBase = object

__all__ = [
    "ACTION_VERSION_PREFIX",
    "VERSION_FORM_FIELD",
    "Merge",
    "OptimisticAdminMixin",
    "OptimisticChangelistFormSet",
    "OptimisticFormMixin",
    "SignedRead",
    "sign_version",
    "unsign_version",
]

_SESSION_KEY = "django_distlock.action_selection.{label}"
_csrf_protect_m = method_decorator(csrf_protect)


def _as_get(request: HttpRequest) -> HttpRequest:
    """A copy of ``request`` that the admin's views handle as a GET of the same page."""
    shown = copy.copy(request)
    shown.method = "GET"
    return shown


class OptimisticAdminMixin(_AdminBase):
    """Refuse admin edits and actions that would overwrite someone else's changes.

    Use it first in the bases: ``class ProductAdmin(OptimisticAdminMixin,
    admin.ModelAdmin)``, for a model using
    :class:`~django_distlock.contrib.optimistic.OptimisticLockMixin`. It works through
    the admin's public hooks (``get_form``, ``get_fieldsets``, ``save_model``,
    ``changeform_view``, ``get_changelist_form``, ``get_changelist_formset``,
    ``changelist_view``, ``action_checkbox``, ``response_action``); a subclass
    overriding one of them must call ``super()``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per request being handled: the merges its forms noted (POST), or are to show.
        self._distlock_pending: WeakKeyDictionary[HttpRequest, dict[str, Merge]]
        self._distlock_pending = WeakKeyDictionary()
        self._distlock_show: WeakKeyDictionary[HttpRequest, dict[str, Merge]]
        self._distlock_show = WeakKeyDictionary()

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors = super().check(**kwargs)
        try:
            version_field(self.model)
        except ImproperlyConfigured as exc:
            errors.append(
                checks.Error(
                    f"{type(self).__name__} uses OptimisticAdminMixin, but: {exc}",
                    hint="Give the model django_distlock.contrib.optimistic.OptimisticLockMixin.",
                    obj=type(self),
                    id="distlock.E201",
                )
            )
        if self.model._meta.pk.name in self.list_editable:
            errors.append(
                checks.Error(
                    "OptimisticAdminMixin cannot carry row versions when the primary key "
                    "is in list_editable.",
                    hint=f"Remove {self.model._meta.pk.name!r} from list_editable.",
                    obj=type(self),
                    id="distlock.E202",
                )
            )
        return errors

    def _form_attrs(self, request: HttpRequest) -> dict[str, Any]:
        return {
            "distlock_pending": self._distlock_pending.get(request),
            "distlock_show": self._distlock_show.get(request, {}),
        }

    # -- change form -----------------------------------------------------------

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        """The admin's form, carrying the signed read when it edits an existing row."""
        if kwargs.get("fields"):
            kwargs["fields"] = [f for f in kwargs["fields"] if f != VERSION_FORM_FIELD]
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is None or not self.has_change_permission(request, obj):
            return form  # an add form or a view-only one: nothing will be saved
        return type(form.__name__, (OptimisticFormMixin, form), self._form_attrs(request))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The fieldsets, with the hidden version field in the last one of a change form."""
        fieldsets = list(super().get_fieldsets(request, obj))
        if (
            obj is None
            or not fieldsets
            or VERSION_FORM_FIELD in flatten_fieldsets(fieldsets)
            or not self.has_change_permission(request, obj)
        ):
            return fieldsets
        name, options = fieldsets[-1]
        last = (name, {**options, "fields": [*options["fields"], VERSION_FORM_FIELD]})
        return [*fieldsets[:-1], last]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Save, guarded by the version the user read; nothing when nothing changed.

        A change form posted with no change writes nothing (Django's would
        save the row again, and its new version would refuse every other
        editor's form for no change at all).
        """
        if change and isinstance(form, OptimisticFormMixin):
            if not form.has_changed():
                return
            if form.distlock_read_version is not None:
                setattr(obj, version_field(obj).attname, form.distlock_read_version)
        super().save_model(request, obj, form, change)

    @_csrf_protect_m
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Django's view; a post that clashes with someone else's changes is shown again.

        The form's check (see :class:`OptimisticFormMixin`) notes a
        :class:`Merge`; the view then answers with the change form as a GET
        would show it, built from the merge, and a message saying what the
        other changed. A save that lost a race with another writer after the
        check raised :class:`VersionConflict` inside the view's transaction,
        which rolled everything back; the post is then handled once more.
        """
        view = super().changeform_view
        if request.method != "POST" or object_id is None or "_saveasnew" in request.POST:
            return view(request, object_id, form_url, extra_context)
        pending = self._run_noting(
            request, lambda: view(request, object_id, form_url, extra_context)
        )
        if isinstance(pending, HttpResponse):
            return pending
        merge = next(iter(pending.values()))
        opts = self.model._meta
        text = (
            f"This {opts.verbose_name} was changed by someone else since you opened it, so "
            f"nothing was saved yet. They changed: {'; '.join(merge.changed)}. The form now "
            "shows the current values with your changes on top"
        )
        if merge.clashes:
            text += (
                f"; where you both changed a field ({', '.join(merge.clashes)}), yours is in "
                "the box and theirs beside it"
            )
        self.message_user(request, f"{text}. Check them, then save again.", messages.WARNING)
        return self._show(request, pending, lambda shown: view(shown, object_id, form_url))

    def _run_noting(
        self, request: HttpRequest, run: Callable[[], HttpResponse]
    ) -> HttpResponse | dict[str, Merge]:
        """Run a POST view, noting merges; its response, or the merges when there are any.

        A :class:`VersionConflict` (a write that raced the check) rolled the
        view's transaction back: the POST is run once more, and the row raced
        is then found changed.
        """
        for attempt in (1, 2):
            pending = self._distlock_pending[request] = {}
            try:
                response = run()
            except VersionConflict:
                if attempt == 2:
                    raise
                continue
            finally:
                self._distlock_pending.pop(request, None)
            return pending or response
        raise AssertionError("unreachable")  # pragma: no cover

    def _show(
        self,
        request: HttpRequest,
        merges: dict[str, Merge],
        view: Callable[[HttpRequest], HttpResponse],
    ) -> HttpResponse:
        """The page as a GET shows it, its forms of the merged rows built from the merges.

        Answered to the POST itself: reloading the page sends the post again,
        which finds the same rows changed and shows the same page.
        """
        shown = _as_get(request)
        self._distlock_show[shown] = merges
        try:
            return view(shown)
        finally:
            self._distlock_show.pop(shown, None)

    # -- list_editable ---------------------------------------------------------

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        form = super().get_changelist_form(request, **kwargs)
        attrs = {"distlock_stale_is_error": False, **self._form_attrs(request)}
        return type(form.__name__, (OptimisticFormMixin, form), attrs)

    def get_changelist_formset(self, request: HttpRequest, **kwargs: Any) -> Any:
        base = kwargs.get("formset", BaseModelFormSet)
        if not issubclass(base, OptimisticChangelistFormSet):
            kwargs["formset"] = type(base.__name__, (OptimisticChangelistFormSet, base), {})
        return super().get_changelist_formset(request, **kwargs)

    @_csrf_protect_m
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Django's view; rows changed or deleted by someone else are not saved.

        Before Django's view: rows of the post deleted since (or no longer in
        this admin's queryset) are taken out of it, so that the other rows
        are saved, and named in a message. Rows whose post clashes with
        someone else's changes are not saved; the list is then shown again
        (as a GET shows it) with those rows built from their merges, and a
        message names them. A list shown again because of errors pairs each
        row with its own form (Django pairs them by position in the list as
        it is now).
        """
        view = super().changelist_view
        if request.method != "POST" or "_save" not in request.POST:
            return view(request, extra_context)
        posted, gone = self._without_gone_rows(request)
        pending = self._run_noting(posted, lambda: view(posted, extra_context))
        if gone:
            count = len(gone)
            self.message_user(
                request,
                f"{quoted(gone)} {these(count, 'was', 'were')} deleted by someone else since "
                f"the list was shown; your changes to {these(count, 'it', 'them')} were not "
                "saved.",
                messages.WARNING,
            )
        if isinstance(pending, HttpResponse):
            return self._rows_with_their_forms(pending)
        count = len(pending)
        clashes = [f"{m.name}: {', '.join(m.clashes)}" for m in pending.values() if m.clashes]
        opts = self.model._meta
        text = (
            f"{quoted(m.name for m in pending.values())} {these(count, 'was', 'were')} "
            f"changed by someone else since the list was shown, so your changes to "
            f"{these(count, 'it', 'them')} were not saved yet. The list now shows "
            f"{these(count, 'its', 'their')} current values with your changes on top"
        )
        if clashes:
            text += (
                "; where you both changed a field, yours is in the box and theirs beside it "
                f"({'; '.join(clashes)})"
            )
        self.message_user(
            request,
            f"{text}. Check {these(count, 'this ' + str(opts.verbose_name), 'these')}, then "
            "save again.",
            messages.WARNING,
        )
        return self._show(posted, pending, lambda shown: view(shown, extra_context))

    def _without_gone_rows(self, request: HttpRequest) -> tuple[HttpRequest, list[str]]:
        """The request, its post without the rows deleted since; and their names."""
        prefix = "form"  # a model formset's default prefix, which the changelist uses
        data = request.POST
        try:
            total = int(data.get(f"{prefix}-TOTAL_FORMS", ""))
            initial = int(data.get(f"{prefix}-INITIAL_FORMS", ""))
        except ValueError:
            return request, []  # Django's formset reports the broken management form
        pk = self.model._meta.pk
        posted: dict[int, Any] = {}
        for index in range(total):
            try:
                posted[index] = pk.to_python(data.get(f"{prefix}-{index}-{pk.name}"))
            except ValidationError:
                continue  # Django's formset reports it
        keys = [key for key in posted.values() if key is not None]
        found = set(self.get_queryset(request).filter(pk__in=keys).values_list("pk", flat=True))
        gone = {index for index, key in posted.items() if key is not None and key not in found}
        if not gone:
            return request, []
        names = []
        for index in sorted(gone):
            token = data.get(f"{prefix}-{index}-{VERSION_FORM_FIELD}") or ""
            try:
                names.append(unsign_version(self.model, posted[index], token).name)
            except signing.BadSignature:
                names.append(str(posted[index]))
        kept = [index for index in range(total) if index not in gone]
        renumber = {old: new for new, old in enumerate(kept)}
        row_key = re.compile(rf"{re.escape(prefix)}-(\d+)-(.*)", re.DOTALL)
        without = QueryDict(mutable=True)
        for key, values in data.lists():
            match = row_key.fullmatch(key)
            if match and int(match[1]) < total:
                index = int(match[1])
                if index in gone:
                    continue
                key = f"{prefix}-{renumber[index]}-{match[2]}"
            without.setlist(key, values)
        without[f"{prefix}-TOTAL_FORMS"] = str(len(kept))
        without[f"{prefix}-INITIAL_FORMS"] = str(max(0, initial - len(gone)))
        without._mutable = False
        posted_request = copy.copy(request)
        posted_request.POST = without  # type: ignore[assignment]
        return posted_request, names

    @staticmethod
    def _rows_with_their_forms(response: HttpResponse) -> HttpResponse:
        """A list shown again with errors: each row beside the form posted for it."""
        cl = getattr(response, "context_data", None) and response.context_data.get("cl")  # type: ignore[attr-defined]
        formset = getattr(cl, "formset", None)
        if cl is not None and formset is not None and formset.is_bound:
            cl.result_list = [form.instance for form in formset.forms]
        return response

    # -- actions ---------------------------------------------------------------

    def action_checkbox(self, obj: Any) -> SafeString:
        """Django's checkbox, followed by a hidden input with the row's signed version."""
        return format_html(
            '{}<input type="hidden" name="{}" value="{}">',
            super().action_checkbox(obj),
            f"{ACTION_VERSION_PREFIX}{obj.pk}",
            sign_version(obj),
        )

    def response_action(
        self, request: HttpRequest, queryset: models.QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        """Run the action only if no row it acts on changed since the list was shown.

        The check and the action run in one transaction on the model's write
        database, the rows locked (``SELECT ... FOR UPDATE`` where the
        database has it) from the check until the action is done. With
        "select all", every row the page showed is checked, ticked or not;
        rows of the selection the page did not show cannot be, and a message
        says how many. An action showing an intermediate page (as "delete
        selected" does) gets the checked versions remembered in the session,
        and its confirmation is checked against them.
        """
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        across = request.POST.get("select_across") in ("1", "True", "true")
        if not selected and not across:
            return super().response_action(request, queryset, *args, **kwargs)
        session_key = _SESSION_KEY.format(label=self.model._meta.label_lower)
        confirming = "index" not in request.POST
        remembered = request.session.get(session_key, {}) if confirming else {}
        using = router.db_for_write(self.model)
        with transaction.atomic(using=using):
            check = SelectionCheck(self, request, remembered, using)
            refusal = check.run(selected, queryset if across else None)
            if refusal:
                self.message_user(request, refusal, messages.ERROR)
                return HttpResponseRedirect(request.get_full_path())
            response = super().response_action(request, queryset, *args, **kwargs)
        if check.unchecked:
            opts = self.model._meta
            names = opts.verbose_name if check.unchecked == 1 else opts.verbose_name_plural
            self.message_user(
                request,
                f"The action also covered {check.unchecked} {names} that this page did not "
                "show; changes made to them by others since could not be checked.",
                messages.WARNING,
            )
        if isinstance(response, TemplateResponse):
            request.session[session_key] = check.read
        elif confirming:
            request.session.pop(session_key, None)
        return response
