"""The forms of the optimistic admin: the signed read a page carries, and its check.

:func:`sign_version` and :func:`unsign_version` make and check the token a
page carries for each row: the version read, the values of the fields shown,
the row's name. :class:`OptimisticFormMixin` checks a posted form against it
and against the row as it is now, field by field, and decides what to do
(save, nothing, or a :class:`Merge` to show again). Used by
:class:`~django_distlock.contrib.optimistic.admin.OptimisticAdminMixin`; see
``docs/optimistic-admin.md``.
"""

from __future__ import annotations

import copy
import datetime
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from django import forms
from django.contrib.admin.utils import display_for_field
from django.core import signing
from django.core.exceptions import NON_FIELD_ERRORS, FieldDoesNotExist, ValidationError
from django.db import models
from django.forms.models import BaseModelFormSet
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import capfirst

from .version import get_version, version_field

__all__ = [
    "ACTION_VERSION_PREFIX",
    "VERSION_FORM_FIELD",
    "Merge",
    "OptimisticChangelistFormSet",
    "OptimisticFormMixin",
    "SignedRead",
    "SignedVersionField",
    "sign_version",
    "unsign_version",
]

VERSION_FORM_FIELD = "distlock_version"
"""Name of the hidden form field carrying the signed read (change form and list rows)."""

ACTION_VERSION_PREFIX = "distlock_version_"
"""Prefix of the hidden inputs, one per row (``<prefix><pk>``), next to the action checkboxes."""

STALE_CODE = "distlock_stale"
BAD_TOKEN_CODE = "distlock_bad_token"
_NAME_LENGTH = 100  # of an object's name carried by a token (for messages about deleted rows)


@dataclass(frozen=True)
class SignedRead:
    """What a signed read says: the version, each field's value, the object's name."""

    version: int
    #: Field name -> ``field.value_to_string(instance)`` at the read, or None for NULL.
    values: Mapping[str, Any]
    #: ``str(instance)`` at the read (shortened), to name a row deleted since.
    name: str
    #: Fields read as NULL or as the text "None", which a token signed before NULL was
    #: encoded (version 1 of the format) cannot tell apart.
    unsure: frozenset[str] = frozenset()


def _salt(model: type[models.Model], pk: Any) -> str:
    return f"django_distlock.optimistic_admin:{model._meta.label_lower}:{pk}"


_FORMAT = 2
"""Format of the signed read's values: 2 signs NULL as a JSON null (``"e": 2``). Version 1
(no ``"e"``) held ``value_to_string()``, which makes NULL the text "None" (or "" for dates)."""


def _text(instance: models.Model, name: str) -> Any:
    """The field's value as the signed read holds it: serializers' text, None for NULL."""
    model_field = cast("models.Field[Any, Any]", instance._meta.get_field(name))
    if model_field.value_from_object(instance) is None:
        return None
    return model_field.value_to_string(instance)


def _from_format_1(
    model: type[models.Model], values: dict[str, Any]
) -> tuple[dict[str, Any], frozenset[str]]:
    """Values signed before NULL was encoded, and those that may be NULL or the text "None".

    A nullable field's text that the field cannot parse was NULL (a number's
    "None", a date's ""); a text field's "None" may have been either.
    """
    decoded = dict(values)
    unsure = set()
    for name, text in values.items():
        try:
            model_field = cast("models.Field[Any, Any]", model._meta.get_field(name))
        except FieldDoesNotExist:
            continue
        if not model_field.null or not isinstance(text, str):
            continue
        try:
            model_field.to_python(text)
        except ValidationError:
            decoded[name] = None
            continue
        if text == "None":
            decoded[name] = None
            unsure.add(name)
    return decoded, frozenset(unsure)


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
        "e": _FORMAT,
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
    encoding = payload.get("e", 1)
    if encoding == 1:  # signed by a release before NULL was encoded (a page opened then)
        values, unsure = _from_format_1(model, values)
        return SignedRead(version=version, values=values, name=str(name), unsure=unsure)
    if encoding != _FORMAT:
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
                code=BAD_TOKEN_CODE,
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
        theirs = [n for n in names if self._theirs_changed(n, read)]
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
                code=STALE_CODE,
            )
        return cleaned

    def _theirs_changed(self, name: str, read: SignedRead) -> bool:
        """Whether the row's value of ``name`` now differs from its value at the read."""
        if name in read.unsure:
            # Read as NULL or "None", unknown which: changed unless the post is the
            # value now (then saving the post writes back what the row holds).
            return name in self.changed_data
        return name not in read.values or _text(self.instance, name) != read.values[name]

    def _mine_changed(self, name: str, read: SignedRead) -> bool:
        """Whether the posted value of ``name`` differs from its value at the read.

        Django's own comparison of a form field (``Field.has_changed``) against
        the value read, as the form would have had it for its initial value.
        """
        if name not in read.values:
            return name in self.changed_data
        if name in read.unsure:
            return self._differs(name, None) and self._differs(name, "None")
        return self._differs(name, read.values[name])

    def _differs(self, name: str, text: Any) -> bool:
        """Whether the posted value of ``name`` differs from ``text`` (the read's form)."""
        model_field = self.instance._meta.get_field(name)
        try:
            read_value = model_field.to_python(text)
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
                if error.code == BAD_TOKEN_CODE:
                    refused.append(f"{form.instance}: {' '.join(error.messages)}")
        if refused:
            raise ValidationError(refused, code=BAD_TOKEN_CODE)
