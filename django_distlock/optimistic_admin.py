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
(see :mod:`django_distlock.optimistic`), so a write landing between the
check and the save is refused too. See ``docs/optimistic-admin.md``.
"""

from __future__ import annotations

import copy
import datetime
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
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
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import capfirst
from django.views.decorators.csrf import csrf_protect

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
    "Merge",
    "OptimisticAdminMixin",
    "OptimisticChangelistFormSet",
    "OptimisticFormMixin",
    "SignedRead",
    "sign_version",
    "unsign_version",
]

VERSION_FORM_FIELD = "distlock_version"
"""Name of the hidden form field carrying the signed read (change form and list rows)."""

ACTION_VERSION_PREFIX = "distlock_version_"
"""Prefix of the hidden inputs, one per row (``<prefix><pk>``), next to the action checkboxes."""

_SESSION_KEY = "django_distlock.action_selection.{label}"
_STALE_CODE = "distlock_stale"
_BAD_TOKEN_CODE = "distlock_bad_token"
_NAME_LENGTH = 100  # of an object's name carried by a token (for messages about deleted rows)
_csrf_protect_m = method_decorator(csrf_protect)


@dataclass(frozen=True)
class SignedRead:
    """What a signed read says: the version, each field's value, the object's name."""

    version: int
    #: Field name -> ``field.value_to_string(instance)`` at the read.
    values: Mapping[str, Any]
    #: ``str(instance)`` at the read (shortened), to name a row deleted since.
    name: str


def _salt(model: type[models.Model], pk: Any) -> str:
    return f"django_distlock.optimistic_admin:{model._meta.label_lower}:{pk}"


def _text(instance: models.Model, name: str) -> Any:
    """The field's value as serializers and the signed read hold it."""
    return instance._meta.get_field(name).value_to_string(instance)  # type: ignore[union-attr]


def sign_version(instance: models.Model, field_names: Iterable[str] = ()) -> str:
    """Sign what ``instance`` was read at, for a page to carry and post back.

    The token holds the version, the values of ``field_names`` (signed, not
    encrypted: they are the values the page shows) and the object's name.

    :param instance: a saved instance of a model with one VersionField.
    :param field_names: concrete fields whose values at the read the token
        carries, so that a later post can be compared with them field by field.
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
    payload = {
        "v": get_version(instance),
        "f": {name: _text(instance, name) for name in names},
        "n": str(instance)[:_NAME_LENGTH],
    }
    signer = signing.Signer(salt=_salt(type(instance), instance.pk))
    return signer.sign_object(payload, compress=True)


def unsign_version(model: type[models.Model], pk: Any, token: str) -> SignedRead:
    """Check a token made by :func:`sign_version` for this model's row ``pk``.

    :param model: the model class the token must have been signed for.
    :param pk: the primary key the token must have been signed for.
    :param token: the posted token.
    :returns: the version, field values and name it carries.
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
        version, values, name = payload["v"], payload["f"], payload.get("n", str(pk))
    except (AttributeError, KeyError, TypeError) as exc:  # signed by us: a format change
        raise signing.BadSignature("The signed version has an unknown format.") from exc
    if isinstance(version, bool) or not isinstance(version, int) or not isinstance(values, dict):
        raise signing.BadSignature("The signed version has an unknown format.")
    return SignedRead(version=version, values=values, name=str(name))


@dataclass
class Merge:
    """A stale form of one row, to show again instead of saving it.

    The row changed since the editor read it, on fields of the form, and the
    editor changed fields too. The form is shown again with the row's current
    values, the editor's changes on top (``mine``) and, for each field both
    changed to different values, the other's value beside the editor's.
    """

    #: The row's name, for messages.
    name: str
    #: The signed read of the row as the merge saw it: the next post is checked against it.
    token: str
    #: Field name -> the editor's posted widget value, for the fields the editor changed.
    mine: dict[str, Any] = field(default_factory=dict)
    #: Field name -> display of the current value, for fields both changed differently.
    theirs: dict[str, str] = field(default_factory=dict)
    #: "Label (now: value)" of each field of the form that the other changed.
    changed: list[str] = field(default_factory=list)
    #: Labels of the fields both changed differently.
    clashes: list[str] = field(default_factory=list)


def _display(instance: models.Model, name: str) -> str:
    """A field's current value as the admin shows it, as plain text."""
    model_field = cast("models.Field[Any, Any]", instance._meta.get_field(name))
    value = getattr(instance, name)
    if isinstance(model_field, models.BooleanField) and value is not None:
        return "yes" if value else "no"
    return str(display_for_field(value, model_field, "-"))


def _label(instance: models.Model, name: str) -> str:
    return str(capfirst(getattr(instance._meta.get_field(name), "verbose_name", name)))


class SignedVersionField(forms.CharField):
    """A hidden field holding a signed read; never counts as a change of the form."""

    widget = forms.HiddenInput

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("label", "")
        super().__init__(**kwargs)

    def has_changed(self, initial: Any, data: Any) -> bool:
        return False


class _TheirsBeside:
    """Mixed into a copy of a field's widget: the other's value rendered beside the input."""

    distlock_theirs = ""

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        html = super().render(name, value, attrs, renderer)  # type: ignore[misc]
        return format_html(
            '<span class="distlock-clash"><span class="distlock-mine">{}</span> '
            '<span class="distlock-theirs" style="display:inline-block;margin-left:.5em;'
            'padding:2px 6px;border-left:3px solid #ba2121;background:#fff5e5;">'
            "&#8592; yours &middot; theirs: <strong>{}</strong></span></span>",
            html,
            self.distlock_theirs,
        )


@functools.cache
def _beside_class(widget_class: type[forms.Widget]) -> type[forms.Widget]:
    return type(f"Theirs{widget_class.__name__}", (_TheirsBeside, widget_class), {})


def _beside(widget: forms.Widget, theirs: str) -> forms.Widget:
    """A copy of ``widget`` (any class) that renders ``theirs`` beside its input."""
    cls = _beside_class(type(widget))
    shown = copy.copy(widget)
    shown.__class__ = cls
    shown.distlock_theirs = theirs  # type: ignore[attr-defined]
    return shown


class OptimisticFormMixin(forms.ModelForm):
    """A model form carrying the signed read of its instance; ``clean()`` checks it.

    Mixed (first) into the admin's change form and ``list_editable`` form by
    :class:`OptimisticAdminMixin`. On an unbound form of a saved instance the
    hidden field holds :func:`sign_version` of it (or, for a form shown again
    after a conflict, the read of its :class:`Merge`, with the editor's
    values). On a bound one, ``clean()`` refuses a missing or invalid token
    and compares the signed read, the posted values and the instance (read
    from the database for this request), setting :attr:`distlock_outcome`:

    - ``"save"``: the row did not change since the read, or changed only on
      fields not on this form (then the save is guarded by its current version);
    - ``"nothing"``: nothing of the editor's differs from the row as it is now:
      no write (``has_changed()`` is False);
    - ``"merge"``: both changed fields of the form: nothing is saved, the
      :class:`Merge` is noted in :attr:`distlock_pending` and, on a change
      form, the form is invalid.
    """

    distlock_version = SignedVersionField()

    distlock_stale_is_error: ClassVar[bool] = True
    """True: a merge makes the form invalid (change form). False: the row is skipped."""

    distlock_pending: ClassVar[dict[str, Merge] | None] = None
    """Where a merge is noted, by the row's primary key (as a string), or None."""

    distlock_show: ClassVar[Mapping[str, Merge]] = {}
    """Merges to show, by primary key: an unbound form of such a row shows its merge."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.distlock_read_version: int | None = None
        self.distlock_outcome = "save"
        pk = self.instance.pk
        if self.is_bound or pk is None:
            return
        merge = self.distlock_show.get(str(pk))
        if merge is None:
            self.initial[VERSION_FORM_FIELD] = sign_version(
                self.instance, self.distlock_field_names()
            )
            return
        self.initial[VERSION_FORM_FIELD] = merge.token
        self.initial.update({k: v for k, v in merge.mine.items() if k in self.fields})
        for name, theirs in merge.theirs.items():
            if name in self.fields:
                self.fields[name].widget = _beside(self.fields[name].widget, theirs)

    def distlock_field_names(self) -> list[str]:
        """The model fields on this form, whose values at the read the token carries."""
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
        names = self.distlock_field_names()
        mine = [n for n in names if self._mine_changed(n, read)]
        if not mine or not self.changed_data:  # changed_data: the post against the row now
            self.distlock_outcome = "nothing"
            self.__dict__["changed_data"] = []  # so has_changed() and the change message agree
            return cleaned
        theirs = [n for n in names if n not in read.values or _text(instance, n) != read.values[n]]
        if not theirs:
            # Changed since the read, but none of this form's fields: the instance
            # was loaded for this request, so saving the form's values on top of it
            # loses nothing. Rebase: the save is guarded by the current version.
            self.distlock_read_version = current
            return cleaned
        merge = self._merge(mine, theirs)
        self.distlock_outcome = "merge"
        if self.distlock_pending is not None:
            self.distlock_pending[str(instance.pk)] = merge
        if self.distlock_stale_is_error:
            raise ValidationError(
                f"This {opts.verbose_name} was changed by someone else since you opened it, "
                f"so your changes were not saved. Changed since then: "
                f"{'; '.join(merge.changed)}.",
                code=_STALE_CODE,
            )
        return cleaned

    def _mine_changed(self, name: str, read: SignedRead) -> bool:
        """Whether the posted value of ``name`` differs from its value at the read.

        Django's own comparison of a form field (``Field.has_changed``) against
        the value read, as the form would have had it for its initial value.
        """
        if name not in read.values:
            return name in self.changed_data
        model_field = self.instance._meta.get_field(name)
        try:
            read_value = model_field.to_python(read.values[name])
        except ValidationError:
            return True
        form_field = self.fields[name]
        if (
            isinstance(read_value, datetime.datetime | datetime.time)
            and not form_field.widget.supports_microseconds  # as BoundField.initial does
        ):
            read_value = read_value.replace(microsecond=0)
        return form_field.has_changed(read_value, self[name].data)

    def _merge(self, mine: list[str], theirs: list[str]) -> Merge:
        instance = self.instance
        clashes = [n for n in mine if n in theirs and n in self.changed_data]
        return Merge(
            name=str(instance),
            token=sign_version(instance, self.distlock_field_names()),
            mine={n: self[n].data for n in mine},
            theirs={n: _display(instance, n) for n in clashes},
            changed=[f"{_label(instance, n)} (now: {_display(instance, n)})" for n in theirs],
            clashes=[_label(instance, n) for n in clashes],
        )

    def has_changed(self) -> bool:
        """False unless this form's values are to be saved (see :attr:`distlock_outcome`)."""
        return super().has_changed() and self.distlock_outcome == "save"


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
    """The ``list_editable`` formset: each row carries its signed read."""

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


def _as_get(request: HttpRequest) -> HttpRequest:
    """A copy of ``request`` that the admin's views handle as a GET of the same page."""
    shown = copy.copy(request)
    shown.method = "GET"
    return shown


def _names(names: Iterable[str]) -> str:
    return ", ".join(f"“{name}”" for name in names)


def _these(count: int, singular: str, plural: str) -> str:
    return singular if count == 1 else plural


class OptimisticAdminMixin(_AdminBase):
    """Refuse admin edits and actions that would overwrite someone else's changes.

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
                f"{_names(gone)} {_these(count, 'was', 'were')} deleted by someone else since "
                f"the list was shown; your changes to {_these(count, 'it', 'them')} were not "
                "saved.",
                messages.WARNING,
            )
        if isinstance(pending, HttpResponse):
            return self._rows_with_their_forms(pending)
        count = len(pending)
        clashes = [f"{m.name}: {', '.join(m.clashes)}" for m in pending.values() if m.clashes]
        opts = self.model._meta
        text = (
            f"{_names(m.name for m in pending.values())} {_these(count, 'was', 'were')} "
            f"changed by someone else since the list was shown, so your changes to "
            f"{_these(count, 'it', 'them')} were not saved yet. The list now shows "
            f"{_these(count, 'its', 'their')} current values with your changes on top"
        )
        if clashes:
            text += (
                "; where you both changed a field, yours is in the box and theirs beside it "
                f"({'; '.join(clashes)})"
            )
        self.message_user(
            request,
            f"{text}. Check {_these(count, 'this ' + str(opts.verbose_name), 'these')}, then "
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
            check = _Selection(self, request, remembered, using)
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


@dataclass
class _Selection:
    """The check of the rows an action is about to act on (see ``response_action``)."""

    admin: OptimisticAdminMixin
    request: HttpRequest
    remembered: dict[str, int]
    using: str
    #: pk (as posted) -> version checked, for the rows acted on.
    read: dict[str, int] = field(default_factory=dict)
    #: Rows of a "select all" selection the page did not show.
    unchecked: int = 0

    def run(self, selected: list[str], across: models.QuerySet[Any] | None) -> str | None:
        """Why the action must not run, or None; fills :attr:`read` and :attr:`unchecked`."""
        model = self.admin.model
        opts = model._meta
        post = self.request.POST
        if across is not None:  # every row the page showed: their inputs are all posted
            selected = [
                key[len(ACTION_VERSION_PREFIX) :]
                for key in post
                if key.startswith(ACTION_VERSION_PREFIX)
            ]
        tokens: dict[str, SignedRead] = {}
        invalid = []
        for pk in selected:
            token = post.get(f"{ACTION_VERSION_PREFIX}{pk}")
            if token is None and len(selected) == 1:
                token = post.get(VERSION_FORM_FIELD)  # an action of the change form
            if token is None and pk in self.remembered:
                self.read[pk] = self.remembered[pk]
                continue
            try:
                tokens[pk] = unsign_version(model, pk, token or "")
            except signing.BadSignature:
                invalid.append(pk)
            else:
                self.read[pk] = tokens[pk].version
        if invalid:
            return (
                f"The action was not run: the versions of the selected {opts.verbose_name_plural} "
                f"with keys {', '.join(invalid)} are missing or invalid. Select them again "
                "in the list below and retry."
            )
        field_ = version_field(model)
        try:
            keys = {opts.pk.to_python(pk): pk for pk in selected}
        except ValidationError:
            return "The action was not run: the selection holds invalid keys."
        rows = model._base_manager.using(self.using).select_for_update()
        current = {keys[obj.pk]: obj for obj in rows.filter(pk__in=list(keys)).order_by()}
        changed = [
            str(current[pk])
            for pk in selected
            if pk in current and getattr(current[pk], field_.attname) != self.read[pk]
        ]
        deleted = [tokens[pk].name if pk in tokens else pk for pk in selected if pk not in current]
        if changed or deleted:
            parts = []
            if changed:
                parts.append(f"changed {_names(changed)}")
            if deleted:
                parts.append(f"deleted {_names(deleted)}")
            count = len(changed) + len(deleted)
            return (
                f"The action was not run: someone else {' and '.join(parts)} since the list "
                f"was shown. The list below shows {_these(count, 'it', 'them')} as "
                f"{_these(count, 'it is', 'they are')} now: check, then select again."
            )
        if across is not None:
            # Locked through the model's own table: the admin's queryset may group rows
            # (annotations), which FOR UPDATE refuses.
            acted = rows.filter(pk__in=across.order_by().values("pk")).values_list(
                "pk", field_.attname
            )
            for key, version in acted:
                if str(key) not in self.read:
                    self.unchecked += 1
                    self.read[str(key)] = version
        return None
