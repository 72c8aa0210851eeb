"""The fencing-token column, and reading a fence: a held lock handle or an int token."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import models

from django_distlock.exceptions import LockLost, LockNotHeld, UnsupportedOperation
from django_distlock.handle import Lock, hold_of
from django_distlock.leadership import Term

from ..version import VersionField

if TYPE_CHECKING:
    from django.db.models import Field

#: The largest value a ``BigIntegerField`` stores on every supported database.
MAX_TOKEN = 2**63 - 1
#: The import path :meth:`FencingTokenField.deconstruct` writes into migrations.
PATH = "django_distlock.contrib.optimistic.fencing.FencingTokenField"


class FencingTokenField(models.BigIntegerField):
    """The fencing token of the last fenced write of a row; NULL until one happened.

    Always nullable and never editable in forms: only fenced writes set it.
    """

    description = "Fencing token of the last fenced write"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for option, value in (("null", True), ("editable", False)):
            if kwargs.get(option, value) is not value:
                raise TypeError(
                    f"FencingTokenField is always {option}={value}; remove {option}= "
                    "from its arguments."
                )
            kwargs[option] = value
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        """Return the field's migration form, under its public path (as Django's own
        fields give ``django.db.models.CharField``): migrations import
        ``django_distlock.contrib.optimistic.fencing.FencingTokenField``, not the module
        it is defined in.

        :returns: ``(name, path, args, kwargs)``.
        """
        name, path, args, kwargs = super().deconstruct()
        if type(self) is FencingTokenField:
            path = PATH
        kwargs.pop("null", None)
        kwargs.pop("editable", None)
        return name, path, args, kwargs


def fencing_field(model: type[models.Model] | models.Model) -> FencingTokenField:
    """Return the one :class:`FencingTokenField` of ``model`` (a class or an instance).

    :raises TypeError: if the model has none (it is not a fenced model).
    :raises ImproperlyConfigured: if it has more than one.
    """
    found = [f for f in model._meta.concrete_fields if isinstance(f, FencingTokenField)]
    label = model._meta.label
    if not found:
        raise TypeError(
            f"{label} has no FencingTokenField: derive it from FencedModelMixin or add "
            "a FencingTokenField to use fenced writes."
        )
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise ImproperlyConfigured(
            f"{label} has several FencingTokenFields ({names}); a fenced model has exactly one."
        )
    return found[0]


def fencing_token_of(fence: Lock | Term | int) -> int:
    """Return the fencing token of ``fence``: a held lock handle, a leadership
    :class:`~django_distlock.leadership.Term` (its epoch) or an int token.

    Only local state is checked (no I/O); whether the token is still the
    newest is decided by the storage, at the write.

    :raises TypeError: if ``fence`` is neither a :class:`~django_distlock.handle.Lock`,
        a term nor an int (a bool is refused).
    :raises ValueError: if an int token is negative or does not fit a BIGINT.
    :raises LockLost: if the handle's lease is known, or must be assumed, gone; for a
        term, :class:`~django_distlock.exceptions.LeadershipLost` (one) when it is lost.
    :raises LockNotHeld: if the handle does not hold its lock (never acquired, released).
    :raises UnsupportedOperation: if the handle's backend issues no fencing tokens.
    """
    if isinstance(fence, Term):
        fence.check()
        return fence.epoch
    if isinstance(fence, Lock):
        if fence.lost:
            raise LockLost(
                f"{fence!r} was lost (its lease ended or was taken away); a fenced write "
                "with it is refused. Re-acquire the lock and re-read the data."
            )
        if not fence.held:
            raise LockNotHeld(f"{fence!r} is not held; acquire it before a fenced write.")
        token = fence.fencing_token
        if token is None:
            raise UnsupportedOperation(
                f"{fence!r}: backend {fence.backend.alias!r} issues no fencing tokens."
            )
        return token
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise TypeError(
            "fence must be a held django_distlock Lock handle or an int fencing token, "
            f"not {type(fence).__name__}."
        )
    if not 0 <= fence <= MAX_TOKEN:
        raise ValueError(f"A fencing token is an int from 0 to 2**63 - 1, got {fence}.")
    return fence


def check_fence_scope(fence: Lock | Term | int, using: str) -> None:
    """Let the handle's backend refuse a write it cannot fence on ``using`` (transaction
    mode: a write outside the holding transaction), before any query.

    :param fence: a lock handle (checked by its backend), a term or an int token (nothing
        to check).
    :param using: the database alias the write goes to.
    :raises UnsupportedOperation: when the backend cannot fence a write on ``using``.
    """
    if isinstance(fence, Lock):
        fence.backend.check_fenced_write(hold_of(fence), using)


def version_field_of(model: type[models.Model]) -> Field[Any, Any] | None:
    """Return the model's optimistic-locking version column, if it has exactly one.

    :param model: a model class.
    :returns: its one :class:`~django_distlock.contrib.optimistic.VersionField`, or None.
    """
    found = [f for f in model._meta.concrete_fields if isinstance(f, VersionField)]
    return found[0] if len(found) == 1 else None


def writable_fields(model: type[models.Model]) -> list[Field[Any, Any]]:
    """Return the concrete fields an UPDATE of ``model`` may write.

    :param model: a model class.
    :returns: its concrete fields less the primary key and generated ones.
    """
    return [
        f
        for f in model._meta.concrete_fields
        if not f.primary_key and not getattr(f, "generated", False)
    ]
