"""The version column of optimistic locking, and how to find it on a model."""

from __future__ import annotations

import time
from typing import Any, cast

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import models

__all__ = ["VersionField", "clock_version", "get_version", "version_field"]


#: Attribute of an instance's ``_state``, True while the mixin inserts a row
#: whose key in the version's table is a parent link that the database assigns.
KEY_ASSIGNED = "distlock_key_assigned"


def clock_version() -> int:
    """The wall clock in microseconds since 1970: where a row whose key may be reused starts."""
    return time.time_ns() // 1000


class VersionField(models.PositiveBigIntegerField):
    """The version column of an optimistic-locking model: +1 per save.

    A new row starts at 1 when the database assigns its primary key (a key
    never used before); a row inserted with a key given by the caller (an
    explicit pk, a pk from a default, a recovered or loaded row) may reuse the
    key of a deleted row that readers still hold versions of, so it starts at
    :func:`clock_version` instead, above any version that deleted row reached.
    The version an instance carries is never inserted: it was not read from the row.
    In a multi-table child's table the key is the parent link, which Django
    fills from the parent row it inserts first: the mixin's save tells
    (``KEY_ASSIGNED``) when the database assigned that row's key.

    Not editable in forms: a form that posted it back could claim any version.
    """

    description = "Optimistic locking version"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 1)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        """On an insert (``save()``, ``bulk_create()``): the row's initial version."""
        if not add:
            return super().pre_save(model_instance, add)
        value = self.get_default()
        owner = cast(type[models.Model], self.model)
        if getattr(model_instance, owner._meta.pk.attname) is not None and not getattr(
            model_instance._state, KEY_ASSIGNED, False
        ):
            value = max(value, clock_version())
        setattr(model_instance, self.attname, value)
        return value

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        path = "django_distlock.contrib.optimistic.VersionField"  # the public path, for migrations
        if kwargs.get("default") == 1:
            del kwargs["default"]
        if kwargs.get("editable", True) is False:
            del kwargs["editable"]
        return name, path, args, kwargs

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages = super().check(**kwargs)
        model = getattr(self, "model", None)
        # The mixin marks its models; importing it here would make an import cycle.
        if model is not None and not getattr(model, "_distlock_checked_saves", False):
            messages.append(
                checks.Warning(
                    f"{model._meta.label}.{self.name} is a VersionField but the model does not "
                    "inherit OptimisticLockMixin, so nothing checks or bumps it.",
                    hint="Add django_distlock.contrib.optimistic.OptimisticLockMixin to the "
                    "model's bases.",
                    obj=self,
                    id="distlock.W101",
                )
            )
        return messages


def version_fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    return [f for f in model._meta.concrete_fields if isinstance(f, VersionField)]


def version_field(model_or_instance: type[models.Model] | models.Model) -> models.Field[Any, Any]:
    """Return the one :class:`VersionField` of a model class or instance.

    :param model_or_instance: a concrete model class, or an instance of one.
    :returns: the field (its ``attname`` is the column's attribute on instances).
    :raises TypeError: when given something that is not a Django model or instance.
    :raises ImproperlyConfigured: when the model has no VersionField, or more than one.
    """
    if isinstance(model_or_instance, models.Model):
        model: type[models.Model] = type(model_or_instance)
    elif isinstance(model_or_instance, type) and issubclass(model_or_instance, models.Model):
        model = model_or_instance
    else:
        raise TypeError(
            f"version_field() takes a model class or instance, not {model_or_instance!r}."
        )
    found = version_fields(model)
    if len(found) != 1:
        raise ImproperlyConfigured(count_message(model, found))
    return found[0]


def count_message(model: type[models.Model], found: list[models.Field[Any, Any]]) -> str:
    names = ", ".join(f.name for f in found) or "none"
    return (
        f"{model._meta.label} needs exactly one VersionField for optimistic locking "
        f"(found: {names}). Keep the inherited 'version', or set 'version = None' and "
        "declare one VersionField under another name."
    )


def get_version(instance: models.Model) -> int:
    """Return the version the instance was read (or last saved) at.

    :param instance: an instance of a model with one :class:`VersionField`.
    :returns: the version number held by the instance (not re-read from the database).
    :raises TypeError: when ``instance`` is not a model instance.
    :raises ImproperlyConfigured: when its model has no VersionField, or more than one.
    """
    if not isinstance(instance, models.Model):
        raise TypeError(f"get_version() takes a model instance, not {instance!r}.")
    return cast(int, getattr(instance, version_field(instance).attname))
