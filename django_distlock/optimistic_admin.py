"""Concurrent-edit detection in the Django admin for optimistic-locking models.

Put :class:`OptimisticAdminMixin` before ``admin.ModelAdmin``. Every page that
lets a user change rows carries the version each row was read at, signed
with :mod:`django.core.signing` (salt bound to the model and the primary key):

- the change form, in a hidden field: a save of a row changed since the form
  was opened is refused with a form error naming the changed fields;
- the ``list_editable`` changelist, in a hidden input rendered with each row's
  primary key: stale rows are not saved (and are reported), the others are;
- the action checkboxes: an action on a selection holding a row changed since
  the list was shown is not run.

The saves themselves are checked ``UPDATE ... WHERE version = <signed>``
(see :mod:`django_distlock.optimistic`), so a write landing between the
check and the save is refused too. See ``docs/optimistic-admin.md``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast
from weakref import WeakKeyDictionary

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import display_for_field, flatten_fieldsets
from django.core import checks, signing
from django.core.exceptions import NON_FIELD_ERRORS, ImproperlyConfigured, ValidationError
from django.db import models, router, transaction
from django.forms.models import BaseModelFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import capfirst

from .exceptions import VersionConflict
from .optimistic import get_version, version_field

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

    _AdminBase = ModelAdmin[Any]
else:
    _AdminBase = object

__all__ = [
    "ACTION_VERSION_PREFIX",
    "VERSION_FORM_FIELD",
    "OptimisticAdminMixin",
    "OptimisticChangelistFormSet",
    "OptimisticFormMixin",
    "SignedRead",
    "sign_version",
    "unsign_version",
]

VERSION_FORM_FIELD = "distlock_version"
"""Name of the hidden form field carrying the signed version (change form and list rows)."""

ACTION_VERSION_PREFIX = "distlock_version_"
"""Prefix of the hidden inputs, one per row (``<prefix><pk>``), next to the action checkboxes."""

_SESSION_KEY = "django_distlock.action_selection.{label}"
_STALE_CODE = "distlock_stale"
_BAD_TOKEN_CODE = "distlock_bad_token"


@dataclass(frozen=True)
class SignedRead:
    """What a signed version says: the version read, and a digest of each field's value."""

    version: int
    digests: Mapping[str, str]


def _salt(model: type[models.Model], pk: Any) -> str:
    return f"django_distlock.optimistic_admin:{model._meta.label_lower}:{pk}"


def _digests(instance: models.Model, names: Iterable[str]) -> dict[str, str]:
    """A short digest of each named field's value (the token is signed, so no key needed)."""
    out = {}
    for name in names:
        field = instance._meta.get_field(name)
        text = field.value_to_string(instance)  # type: ignore[union-attr]
        out[name] = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    return out


def sign_version(instance: models.Model, field_names: Iterable[str] = ()) -> str:
    """Sign the version ``instance`` was read at, for a page to carry and post back.

    :param instance: a saved instance of a model with one VersionField.
    :param field_names: concrete fields whose current values are digested into
        the token, so that a later conflict can name the fields that changed.
    :returns: a URL-safe signed string, valid only for this model and primary key.
    :raises TypeError: ``instance`` is not a model instance, or a name is not a string.
    :raises ValueError: ``instance`` has no primary key, or a name is not a field.
    :raises ImproperlyConfigured: the model has no VersionField, or more than one.
    """
    if not isinstance(instance, models.Model):
        raise TypeError(f"sign_version() takes a model instance, not {instance!r}.")
    if instance.pk is None:
        raise ValueError("sign_version() needs a saved instance: this one has no primary key.")
    names = list(field_names)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"field_names must hold field names (str), not {name!r}.")
        if name not in {f.name for f in instance._meta.concrete_fields}:
            raise ValueError(f"{instance._meta.label} has no concrete field {name!r}.")
    payload = {"v": get_version(instance), "f": _digests(instance, names)}
    signer = signing.Signer(salt=_salt(type(instance), instance.pk))
    return signer.sign_object(payload, compress=True)


def unsign_version(model: type[models.Model], pk: Any, token: str) -> SignedRead:
    """Check a token made by :func:`sign_version` for this model's row ``pk``.

    :param model: the model class the token must have been signed for.
    :param pk: the primary key the token must have been signed for.
    :param token: the posted token.
    :returns: the version and field digests it carries.
    :raises TypeError: ``model`` is not a model class or ``token`` is not a string.
    :raises django.core.signing.BadSignature: the token is empty, altered, or was
        signed for another model or another primary key.
    """
    if not (isinstance(model, type) and issubclass(model, models.Model)):
        raise TypeError(f"unsign_version() takes a model class, not {model!r}.")
    if not isinstance(token, str):
        raise TypeError(f"token must be a string, not {token!r}.")
    payload = signing.Signer(salt=_salt(model, pk)).unsign_object(token)
    try:
        version, digests = payload["v"], payload["f"]
    except (KeyError, TypeError) as exc:  # signed by us, so only a format change gets here
        raise signing.BadSignature("The signed version has an unknown format.") from exc
    if isinstance(version, bool) or not isinstance(version, int) or not isinstance(digests, dict):
        raise signing.BadSignature("The signed version has an unknown format.")
    return SignedRead(version=version, digests=digests)


class SignedVersionField(forms.CharField):
    """A hidden field holding a signed version; never counts as a change of the form."""

    widget = forms.HiddenInput

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("label", "")
        super().__init__(**kwargs)

    def has_changed(self, initial: Any, data: Any) -> bool:
        return False


class OptimisticFormMixin(forms.ModelForm):
    """A model form carrying the signed version of its instance; ``clean()`` checks it.

    Mixed (first) into the admin's change form and ``list_editable`` form by
    :class:`OptimisticAdminMixin`. On an unbound form of a saved instance the
    hidden field holds :func:`sign_version` of it. On a bound one, ``clean()``
    refuses a missing or invalid token and, when the instance's version (read
    from the database for this request) is not the signed one, either adds a
    form error (change form) or marks the form stale (changelist row: it then
    reports no change, so it is not saved, and is listed in ``distlock_conflicts``).
    """

    distlock_version = SignedVersionField()

    distlock_stale_is_error: ClassVar[bool] = True
    """True: a stale form is invalid (change form). False: it is skipped (changelist)."""

    distlock_conflicts: ClassVar[list[str] | None] = None
    """Where a skipped stale row's name is appended (changelist), or None."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.distlock_read_version: int | None = None
        self.distlock_stale = False
        if not self.is_bound and self.instance.pk is not None:
            self.initial[VERSION_FORM_FIELD] = sign_version(
                self.instance, self.distlock_field_names()
            )

    def distlock_field_names(self) -> list[str]:
        """The model fields on this form whose changes a conflict message can name."""
        skip = {self.instance._meta.pk.name, version_field(self.instance).name}
        return [
            f.name
            for f in self.instance._meta.concrete_fields
            if f.name in self.fields and f.name not in skip
        ]

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        instance = self.instance
        if instance.pk is None:
            return cleaned
        token = self.cleaned_data.get(VERSION_FORM_FIELD) or ""
        opts = instance._meta
        try:
            read = unsign_version(type(instance), instance.pk, token)
        except signing.BadSignature as exc:
            what = "is missing" if not token else "is invalid (altered, or from another object)"
            raise ValidationError(
                f"The version this {opts.verbose_name} was read at {what}, so it cannot be "
                "checked for changes made by someone else; nothing was saved. Reload the "
                "page and make your changes again.",
                code=_BAD_TOKEN_CODE,
            ) from exc
        self.distlock_read_version = read.version
        current = get_version(instance)
        if current == read.version:
            return cleaned
        if self._unchanged_on_form(read):
            # Changed since the read, but none of this form's fields: the instance
            # was loaded for this request, so saving the form's values on top of it
            # loses nothing. Rebase: the save is guarded by the current version.
            self.distlock_read_version = current
            return cleaned
        if self.distlock_stale_is_error:
            raise ValidationError(
                f"This {opts.verbose_name} was changed by someone else since you opened it, "
                f"so your changes were not saved. Changed since then: {self._changes(read)}. "
                "Reload the page to see the current values, then make your changes again.",
                code=_STALE_CODE,
            )
        self.distlock_stale = True
        if self.distlock_conflicts is not None and self.changed_data:
            self.distlock_conflicts.append(str(instance))
        return cleaned

    def _unchanged_on_form(self, read: SignedRead) -> bool:
        """Whether every field of this form still has the value signed at the read."""
        names = self.distlock_field_names()
        if not names or any(name not in read.digests for name in names):
            return False
        return _digests(self.instance, names) == {name: read.digests[name] for name in names}

    def _changes(self, read: SignedRead) -> str:
        """Verbose names and current values of the fields that differ from the signed read."""
        instance = self.instance
        names = [n for n in read.digests if n in {f.name for f in instance._meta.concrete_fields}]
        now = _digests(instance, names)
        parts = []
        for name in names:
            if now[name] != read.digests[name]:
                field = instance._meta.get_field(name)
                value = display_for_field(getattr(instance, name), field, "-")
                label = capfirst(getattr(field, "verbose_name", name))
                parts.append(f"{label} (now: {value})")
        return "; ".join(parts) or "fields not shown on this form"

    def has_changed(self) -> bool:
        """False for a stale changelist row, so that the changelist does not save it."""
        return super().has_changed() and not self.distlock_stale


class _PkWithSignedVersion(forms.HiddenInput):
    """The row's hidden primary key, followed by the row's signed-version input.

    Django's changelist renders, of each row's form, only the primary key
    field as a hidden input; this widget makes that input carry the version
    too, whether or not the changelist has actions.
    """

    def __init__(self, form: forms.BaseForm, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs)
        self.form = form

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        html = super().render(name, value, attrs, renderer)
        return mark_safe(html + str(self.form[VERSION_FORM_FIELD]))  # both are escaped widgets


class OptimisticChangelistFormSet(BaseModelFormSet):
    """The ``list_editable`` formset: each row carries its signed version."""

    def add_fields(self, form: Any, index: int | None) -> None:
        super().add_fields(form, index)
        model = cast(type[models.Model], self.model)
        pk_field = form.fields.get(model._meta.pk.name)
        if (
            VERSION_FORM_FIELD in form.fields
            and pk_field is not None
            and isinstance(pk_field.widget, forms.HiddenInput)
        ):
            pk_field.widget = _PkWithSignedVersion(form, attrs=pk_field.widget.attrs)

    def clean(self) -> None:
        """Show bad tokens above the list: the changelist shows no per-row form errors."""
        super().clean()
        refused = []
        for form in self.forms:
            for error in form.errors.as_data().get(NON_FIELD_ERRORS, []):
                if error.code == _BAD_TOKEN_CODE:
                    refused.append(f"{form.instance}: {' '.join(error.messages)}")
        if refused:
            raise ValidationError(refused, code=_BAD_TOKEN_CODE)


class OptimisticAdminMixin(_AdminBase):
    """Refuse admin edits and actions on rows changed by someone else meanwhile.

    Use it first in the bases: ``class ProductAdmin(OptimisticAdminMixin,
    admin.ModelAdmin)``, for a model using
    :class:`~django_distlock.optimistic.OptimisticLockMixin`. It works through
    the admin's public hooks (``get_form``, ``get_fieldsets``, ``save_model``,
    ``changeform_view``, ``get_changelist_form``, ``get_changelist_formset``,
    ``changelist_view``, ``action_checkbox``, ``response_action``); a subclass
    overriding one of them must call ``super()``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Rows of the changelist POST being handled that were skipped as stale.
        self._distlock_stale_rows: WeakKeyDictionary[HttpRequest, list[str]]
        self._distlock_stale_rows = WeakKeyDictionary()

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors = super().check(**kwargs)
        try:
            version_field(self.model)
        except ImproperlyConfigured as exc:
            errors.append(
                checks.Error(
                    f"{type(self).__name__} uses OptimisticAdminMixin, but: {exc}",
                    hint="Give the model django_distlock.optimistic.OptimisticLockMixin.",
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

    # -- change form -----------------------------------------------------------

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        """The admin's form, carrying the signed version when it edits an existing row."""
        if kwargs.get("fields"):
            kwargs["fields"] = [f for f in kwargs["fields"] if f != VERSION_FORM_FIELD]
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is None or not self.has_change_permission(request, obj):
            return form  # an add form or a view-only one: nothing will be saved
        return type(form.__name__, (OptimisticFormMixin, form), {})

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
        """Save, guarded by the version the user read (not the one loaded for this POST)."""
        read = getattr(form, "distlock_read_version", None)
        if change and isinstance(form, OptimisticFormMixin) and read is not None:
            setattr(obj, version_field(obj).attname, read)
        super().save_model(request, obj, form, change)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Django's view; a save that lost a race with another writer is shown as a form error.

        The conflicting save raised :class:`VersionConflict` inside the view's
        transaction, which rolled everything back; the POST is then handled
        again, and this time the form check sees the new version and reports it.
        """
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except VersionConflict:
            if request.method != "POST" or object_id is None:
                raise
        return super().changeform_view(request, object_id, form_url, extra_context)

    # -- list_editable ---------------------------------------------------------

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        form = super().get_changelist_form(request, **kwargs)
        attrs = {
            "distlock_stale_is_error": False,
            "distlock_conflicts": self._distlock_stale_rows.get(request),
        }
        return type(form.__name__, (OptimisticFormMixin, form), attrs)

    def get_changelist_formset(self, request: HttpRequest, **kwargs: Any) -> Any:
        base = kwargs.get("formset", BaseModelFormSet)
        if not issubclass(base, OptimisticChangelistFormSet):
            kwargs["formset"] = type(base.__name__, (OptimisticChangelistFormSet, base), {})
        return super().get_changelist_formset(request, **kwargs)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Django's view; stale ``list_editable`` rows are skipped and named in a message.

        A row that a concurrent writer changed after the form check made its
        save raise :class:`VersionConflict`, rolling back the whole save; the
        POST is then handled once more, and that row is now found stale.
        """
        rerun = request.method == "POST" and "_save" in request.POST
        while True:
            stale = self._distlock_stale_rows[request] = []
            try:
                response = super().changelist_view(request, extra_context)
            except VersionConflict:
                if not rerun:
                    raise
                rerun = False
                continue
            finally:
                self._distlock_stale_rows.pop(request, None)
            break
        if stale:
            self.message_user(
                request,
                f"Not saved, because someone else changed them since the list was shown: "
                f"{_names(stale)}. Reload the list to see their current values, then make "
                "your changes again.",
                messages.ERROR,
            )
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
        """Run the action only if no selected row changed since the list was shown.

        The check and the action run in one transaction on the model's write
        database, the selected rows locked (``SELECT ... FOR UPDATE`` where the
        database has it) from the check until the action is done. An action
        showing an intermediate page (as "delete selected" does) gets the
        checked versions remembered in the session, and its confirmation is
        checked against them.
        """
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if not selected:
            return super().response_action(request, queryset, *args, **kwargs)
        session_key = _SESSION_KEY.format(label=self.model._meta.label_lower)
        confirming = "index" not in request.POST
        remembered = request.session.get(session_key, {}) if confirming else {}
        using = router.db_for_write(self.model)
        with transaction.atomic(using=using):
            versions, refusal = self._check_selection(request, selected, remembered, using)
            if refusal:
                self.message_user(request, refusal, messages.ERROR)
                return HttpResponseRedirect(request.get_full_path())
            response = super().response_action(request, queryset, *args, **kwargs)
        if isinstance(response, TemplateResponse):
            request.session[session_key] = versions
        elif confirming:
            request.session.pop(session_key, None)
        return response

    def _check_selection(
        self, request: HttpRequest, selected: list[str], remembered: dict[str, int], using: str
    ) -> tuple[dict[str, int], str | None]:
        """The read versions of the selected rows, or why the action must not run."""
        opts = self.model._meta
        read: dict[str, int] = {}
        invalid = []
        for pk in selected:
            token = request.POST.get(f"{ACTION_VERSION_PREFIX}{pk}")
            if token is None and len(selected) == 1:
                token = request.POST.get(VERSION_FORM_FIELD)  # an action of the change form
            if token is None and pk in remembered:
                read[pk] = remembered[pk]
                continue
            try:
                read[pk] = unsign_version(self.model, pk, token or "").version
            except signing.BadSignature:
                invalid.append(pk)
        if invalid:
            return read, (
                f"The action was not run: the versions of the selected {opts.verbose_name_plural} "
                f"with keys {', '.join(invalid)} are missing or invalid. Reload the list, "
                "select again and retry."
            )
        field = version_field(self.model)
        try:
            keys = {opts.pk.to_python(pk): pk for pk in selected}
        except ValidationError:
            return read, "The action was not run: the selection holds invalid keys."
        rows = (
            self.model._base_manager.using(using)
            .select_for_update()
            .filter(pk__in=list(keys))
            .order_by()
        )
        current = {keys[obj.pk]: obj for obj in rows}
        changed = [
            str(current[pk]) if pk in current else f"{pk} (deleted)"
            for pk in selected
            if pk not in current or getattr(current[pk], field.attname) != read[pk]
        ]
        if changed:
            return read, (
                f"The action was not run: someone else changed these {opts.verbose_name_plural} "
                f"since the list was shown: {_names(changed)}. Reload the list, check them and "
                "select again."
            )
        return read, None


def _names(names: list[str]) -> str:
    return ", ".join(f"“{name}”" for name in names)
