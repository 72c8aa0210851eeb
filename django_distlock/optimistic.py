"""Optimistic locking: a version column checked by every save and delete, and retry helpers.

``save()`` of a row read earlier becomes one ``UPDATE ... WHERE pk = %s AND
version = %s`` that also bumps the version; when no row matches, somebody
else wrote (or deleted) the row since it was read, and
:class:`~django_distlock.exceptions.VersionConflict` is raised with nothing
written. :func:`retry_on_conflict` and :func:`update_with_retry` re-run a
read-modify-write until it wins. See ``docs/optimistic.md``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any, ParamSpec, Self, TypeVar, cast, overload

from asgiref.sync import sync_to_async
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError, connections, models, router, transaction
from django.db.models.base import ModelBase
from django.db.models.signals import class_prepared, post_save, pre_save

from ._saveplan import SavePlan, direct_ok, direct_update
from .backoff import Backoff
from .exceptions import VersionConflict

__all__ = [
    "OptimisticLockMixin",
    "VersionConflict",
    "VersionField",
    "get_version",
    "retry_on_conflict",
    "retryable",
    "update_with_retry",
    "version_field",
]

logger = logging.getLogger("django_distlock")

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound="OptimisticLockMixin")


class VersionField(models.PositiveBigIntegerField):
    """The version column of an optimistic-locking model: starts at 1, +1 per save.

    Not editable in forms: a form that posted it back could claim any version.
    """

    description = "Optimistic locking version"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 1)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("default") == 1:
            del kwargs["default"]
        if kwargs.get("editable", True) is False:
            del kwargs["editable"]
        return name, path, args, kwargs

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages = super().check(**kwargs)
        model = getattr(self, "model", None)
        if model is not None and not issubclass(model, OptimisticLockMixin):
            messages.append(
                checks.Warning(
                    f"{model._meta.label}.{self.name} is a VersionField but the model does not "
                    "inherit OptimisticLockMixin, so nothing checks or bumps it.",
                    hint="Add django_distlock.optimistic.OptimisticLockMixin to the model's bases.",
                    obj=self,
                    id="distlock.W101",
                )
            )
        return messages


def _version_fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
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
    found = _version_fields(model)
    if len(found) != 1:
        raise ImproperlyConfigured(_count_message(model, found))
    return found[0]


def _count_message(model: type[models.Model], found: list[models.Field[Any, Any]]) -> str:
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


class OptimisticLockMixin(models.Model):
    """Give a model a version column that every ``save()`` and ``delete()`` checks.

    A save of a row read earlier is one ``UPDATE`` guarded by the version it
    was read at; a delete first takes the row's write lock with a guarded
    no-op update. Either raises :class:`VersionConflict` and changes nothing
    when the row was changed or deleted since it was read. Models with
    multi-table-inheritance parents pay one more query per save (a guarded
    version bump, then Django's own save, in one transaction).
    """

    version = VersionField()

    class Meta:
        abstract = True

    @classmethod
    def check(cls, **kwargs: Any) -> list[checks.CheckMessage]:
        messages = super().check(**kwargs)
        found = _version_fields(cls)
        if len(found) != 1:
            messages.append(checks.Error(_count_message(cls, found), obj=cls, id="distlock.E101"))
        return messages

    @classmethod
    def from_db(
        cls, db: str | None, field_names: Collection[str], values: Collection[Any], **kwargs: Any
    ) -> Self:
        """Django's loading, noting the primary key the row was read with."""
        instance = super().from_db(db, field_names, values, **kwargs)
        setattr(instance._state, _READ_PK, instance.pk)  # see _pk_changed()
        return instance

    def save(
        self,
        *args: Any,
        force_insert: bool | tuple[ModelBase, ...] = False,
        force_update: bool = False,
        using: str | None = None,
        update_fields: Iterable[str] | None = None,
    ) -> None:
        """Insert a new row, or update a read row only if its version is unchanged.

        Inserts, as in Django: a new instance, ``force_insert``, no primary
        key (the copy idiom), a loaded instance whose primary key was changed.
        A new row starts at the field's initial version (1). A new instance
        with an explicit primary key, or a changed one, is inserted with
        ``force_insert``: it was never read, so it cannot vouch for the
        version of a row with that key (an existing row gives
        ``IntegrityError``). A multi-table child built for an existing parent
        row updates that row (as Django does) only if the child carries the
        parent's version, and bumps it. Everything else is a checked update;
        on success the instance's version is one higher.

        :raises VersionConflict: the row's version is not the instance's (it was
            changed or deleted since it was read); nothing was written and the
            instance's version is unchanged.
        :raises ValueError: unknown ``update_fields`` names, a deferred version
            field, an unsaved related object (as Django's save does).
        :raises TypeError: positional arguments on a Django that refuses them (6.0+).
        """
        if args:
            force_insert, force_update, using, update_fields = _positional(
                self, args, force_insert, force_update, using, update_fields
            )
        if force_insert or self.pk is None:
            self._insert(force_insert, force_update, using, update_fields)
            return
        if (
            (self._state.adding or self._pk_changed())
            and not force_update
            and update_fields is None
        ):
            self._insert(True, False, using, None)
            return
        # Django's own first step (unsaved objects in foreign keys and generic foreign keys).
        self._prepare_related_fields_for_save(operation_name="save")  # type: ignore[attr-defined]
        plan = _plan(type(self))
        if update_fields is not None:
            update_fields = frozenset(update_fields)
            if not update_fields:
                return  # like Django: an empty update_fields saves nothing and sends no signal
            _refuse_unknown(update_fields, plan.allowed)
        using = using or router.db_for_write(type(self), instance=self)
        field = plan.field
        deferred = self.get_deferred_fields()
        if field.attname in deferred:
            raise ValueError(
                f"Cannot save {self._meta.label} pk={self.pk!r}: its version field "
                f"{field.name!r} was deferred, so the version it was read at is unknown. "
                "Do not defer it (.defer()/.only())."
            )
        if update_fields is None and deferred and using == self._state.db:
            # Django saves only the loaded fields of a deferred instance; so do we.
            update_fields = frozenset(
                f.attname
                for f in self._meta.concrete_fields
                if not f.primary_key and not f.generated and f.attname not in deferred
            )
        expected = _expected_version(self, field)
        if update_fields is not None:
            update_fields = update_fields | {field.name}
        if plan.has_parents:
            self._save_with_parents(field, expected, using, force_update, update_fields)
        else:
            self._save_one_table(plan, expected, using, update_fields)

    save.alters_data = True  # type: ignore[attr-defined]

    def _pk_changed(self) -> bool:
        """Whether the primary key differs from the one the row was read (or saved) with."""
        read = getattr(self._state, _READ_PK, _UNKNOWN)
        return read is not _UNKNOWN and self.pk != read

    def _insert(
        self,
        force_insert: bool | tuple[ModelBase, ...],
        force_update: bool,
        using: str | None,
        update_fields: Iterable[str] | None,
    ) -> None:
        """Django's save of a new row, at the initial version; see :meth:`save`."""
        plan = _plan(type(self))
        field = plan.field
        parent_pk = None
        if plan.owner is not self._meta.concrete_model and not (
            isinstance(force_insert, tuple) and plan.owner in force_insert
        ):
            parent_pk = _owner_pk(self, plan.owner)  # Django updates a parent row that exists
        if parent_pk is not None:
            self._insert_over_parent(plan, parent_pk, force_insert, using)
            return
        before = getattr(self, field.attname)
        setattr(self, field.attname, field.get_default())
        try:
            super().save(
                force_insert=force_insert,
                force_update=force_update,
                using=using,
                update_fields=update_fields,
            )
        except BaseException:
            setattr(self, field.attname, before)
            raise
        setattr(self._state, _READ_PK, self.pk)

    def _insert_over_parent(
        self,
        plan: SavePlan,
        parent_pk: Any,
        force_insert: bool | tuple[ModelBase, ...],
        using: str | None,
    ) -> None:
        """A new child whose parent row (holding the version) may exist: Django
        updates that row with the child's values, so the child must carry its
        version, as if it had been read; the row is then bumped, not reset."""
        field = plan.field
        using = using or router.db_for_write(type(self), instance=self)
        expected = _expected_version(self, field)
        parent = plan.owner._base_manager.using(using).filter(pk=parent_pk)
        with transaction.atomic(using=using):
            if parent.filter(**{field.attname: expected}).update(**{field.attname: expected + 1}):
                setattr(self, field.attname, expected + 1)
            elif parent.exists():
                raise VersionConflict(
                    f"{self._meta.label}: a new instance for the existing "
                    f"{plan.owner._meta.label} row pk={parent_pk!r} carries version "
                    f"{expected}, not the row's: saving it would overwrite that row with "
                    "values nobody read there. Build it from the parent as read: copy the "
                    "parent's fields and its version into it (version=parent.version).",
                    instance=self,
                    expected_version=expected,
                )
            else:
                setattr(self, field.attname, field.get_default())
            try:
                super().save(force_insert=force_insert, using=using)
            except BaseException:
                setattr(self, field.attname, expected)
                raise
        setattr(self._state, _READ_PK, self.pk)

    def _save_one_table(
        self,
        plan: SavePlan,
        expected: int,
        using: str,
        update_fields: frozenset[str] | None,
    ) -> None:
        """The checked save as ONE query: write the fields and the next version if unchanged."""
        origin = type(self)
        pre_save.send(
            sender=origin, instance=self, raw=False, using=using, update_fields=update_fields
        )
        connection = connections[using]
        statement = plan.statement(connection, update_fields)
        values = [
            # own_pre_save is False when the field's pre_save() is Field's: it reads the attribute.
            (f, f.pre_save(self, False) if own_pre_save else getattr(self, f.attname))
            for f, own_pre_save in statement.columns
        ]
        version = plan.field.attname
        pk = getattr(self, plan.owner_pk)
        rows = direct_update(connection, plan, statement, values, pk, expected)
        if rows is None:  # a value Django must compile (an expression...): the ORM writes it
            orm_values = {f.attname: value for f, value in values}
            orm_values[version] = expected + 1
            rows = (
                plan.owner._base_manager.using(using)
                .filter(pk=pk, **{version: expected})
                .update(**orm_values)
            )
        if rows == 0:
            raise _conflict(self, expected, using)
        setattr(self, version, expected + 1)
        self._state.db = using
        self._state.adding = False
        setattr(self._state, _READ_PK, pk)
        post_save.send(
            sender=origin,
            instance=self,
            created=False,
            update_fields=update_fields,
            raw=False,
            using=using,
        )

    def _save_with_parents(
        self,
        field: models.Field[Any, Any],
        expected: int,
        using: str,
        force_update: bool,
        update_fields: frozenset[str] | None,
    ) -> None:
        """Multi-table inheritance: a guarded version bump, then Django's save, atomically."""
        with transaction.atomic(using=using):
            # The bump takes the row's write lock: no other writer gets in before our commit.
            bumped = _guarded(self, field, expected, using).update(**{field.attname: expected + 1})
            if bumped == 0:
                raise _conflict(self, expected, using)
            setattr(self, field.attname, expected + 1)
            try:
                super().save(force_update=force_update, using=using, update_fields=update_fields)
            except BaseException:
                setattr(self, field.attname, expected)
                raise

    def delete(self, using: Any = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        """Delete the row only if its version is still the one the instance was read at.

        :returns: what Django's ``delete()`` returns (count, per-model counts).
        :raises VersionConflict: the row was changed or deleted since it was
            read; nothing was deleted.
        :raises ValueError: the instance has no primary key (as Django's delete does).
        """
        if self.pk is None:
            return super().delete(using=using, keep_parents=keep_parents)  # Django's error
        using = using or router.db_for_write(type(self), instance=self)
        field = version_field(self)
        expected = _expected_version(self, field)
        with transaction.atomic(using=using):
            # A no-op guarded write: takes the row's write lock (PostgreSQL) or
            # the database's (SQLite) and proves the version, until the delete commits.
            # Unfiltered by the base manager: Django's delete() deletes a row it hides.
            guarded = _guarded(self, field, expected, using, unfiltered=True)
            if guarded.update(**{field.attname: expected}) == 0:
                raise _conflict(self, expected)
            return super().delete(using=using, keep_parents=keep_parents)

    delete.alters_data = True  # type: ignore[attr-defined]


def _keep_the_version_newest(
    sender: type[models.Model], instance: models.Model, raw: bool, using: str, **kwargs: Any
) -> None:
    """Before a raw save (``loaddata``, django-reversion's revert) of an existing
    row: never lower its version.

    A raw save writes the version the instance carries, read from a fixture or
    a stored revision: often lower than the row's, which would let the readers
    of an older version win again. It becomes the row's version plus one (the
    raw save is a write: readers before it must conflict), or the instance's
    when that is higher. A new row keeps the instance's version. One query, on
    raw saves only; in a transaction (``loaddata`` and reversion's revert run in
    one) it locks the row until the commit.
    """
    if not raw:
        return
    field = version_field(sender)
    model = sender._meta.concrete_model
    if field.model is not model:  # a raw save of a child does not write its parent's table
        return
    pk = getattr(instance, model._meta.pk.attname)
    if pk is None:
        return
    rows = model._base_manager.using(using).filter(pk=pk)
    if transaction.get_connection(using).in_atomic_block:
        rows = rows.select_for_update()
    stored = list(rows.values_list(field.attname, flat=True)[:1])
    if stored:
        loaded = getattr(instance, field.attname)
        loaded = loaded if isinstance(loaded, int) and not isinstance(loaded, bool) else 0
        setattr(instance, field.attname, max(stored[0] + 1, loaded))


def _guard_raw_saves(sender: type[models.Model], **kwargs: Any) -> None:
    """Connect :func:`_keep_the_version_newest` to each concrete optimistic model."""
    if issubclass(sender, OptimisticLockMixin) and not sender._meta.abstract:
        pre_save.connect(_keep_the_version_newest, sender=sender, weak=False)


class_prepared.connect(_guard_raw_saves)


_PLAN = "_distlock_save_plan"
#: Attribute of an instance's ``_state``: the primary key its row was read (or saved) with.
_READ_PK = "distlock_read_pk"
_UNKNOWN = object()  # no primary key was noted (not loaded by from_db, never saved by us)


def _plan(model: type[models.Model]) -> SavePlan:
    """The model's save plan, from the cache on the class when it is still current.

    :raises ImproperlyConfigured: the model has no VersionField, or more than one.
    """
    source = model._meta.concrete_fields
    plan = model.__dict__.get(_PLAN)  # not a parent's (a proxy has its own)
    if plan is not None and plan.source is source:
        return cast(SavePlan, plan)
    found: list[models.Field[Any, Any]] = [f for f in source if isinstance(f, VersionField)]
    if len(found) != 1:
        raise ImproperlyConfigured(_count_message(model, found))
    field = found[0]
    owner = cast(type[models.Model], field.model)
    concrete = model._meta.concrete_model or model
    columns = tuple(
        (f.name, f.attname, f, type(f).pre_save is not models.Field.pre_save)
        for f in concrete._meta.local_concrete_fields
        if not (f.primary_key or f.generated or f is field)
    )
    plan = SavePlan(
        source=source,
        field=field,
        owner=owner,
        owner_pk=owner._meta.pk.attname,
        has_parents=bool(concrete._meta.parents),
        columns=columns,
        allowed=frozenset(
            name for f in source if not f.primary_key for name in (f.name, f.attname)
        ),
        direct=direct_ok(owner, field, [f for _, _, f, _ in columns]),
        statements={},
    )
    setattr(model, _PLAN, plan)  # a class attribute: it lives and dies with the class
    return plan


def _guarded(
    instance: models.Model,
    field: models.Field[Any, Any],
    expected: int,
    using: str,
    *,
    unfiltered: bool = False,
) -> models.QuerySet[Any]:
    """The row of ``instance`` in the table holding the version, if at ``expected``.

    Through the base manager, as Django's save writes; ``unfiltered``: through
    a plain queryset, as Django's delete deletes.
    """
    owner = cast(type[models.Model], field.model)
    pk = getattr(instance, owner._meta.pk.attname)
    rows = models.QuerySet(owner, using=using) if unfiltered else owner._base_manager.using(using)
    return rows.filter(pk=pk, **{field.attname: expected})


def _owner_pk(instance: models.Model, owner: type[models.Model]) -> Any:
    """The primary key of ``instance``'s row in its parent table ``owner``, if set."""
    pk = getattr(instance, owner._meta.pk.attname)
    if pk is None:  # set only through the link (Shop(place_ptr=place)): Django syncs it so
        link = instance._meta.get_ancestor_link(owner)
        pk = None if link is None else getattr(instance, link.attname)
    return pk


def _positional(
    instance: models.Model,
    args: tuple[Any, ...],
    force_insert: Any,
    force_update: Any,
    using: Any,
    update_fields: Any,
) -> tuple[Any, Any, Any, Any]:
    """``save(False, False, "db", [...])``: what Django's own save does with it."""
    parse = getattr(instance, "_parse_save_params", None)
    if parse is None:  # Django 6.0+: keyword arguments only, as for Model.save()
        raise TypeError(
            f"{type(instance).__name__}.save() takes 1 positional argument but "
            f"{len(args) + 1} were given"
        )
    return cast(
        tuple[Any, Any, Any, Any],
        parse(  # Django 5.2: accepted, with its deprecation warning
            *args,
            method_name="save",
            force_insert=force_insert,
            force_update=force_update,
            using=using,
            update_fields=update_fields,
        ),
    )


def _expected_version(instance: models.Model, field: models.Field[Any, Any]) -> int:
    value = getattr(instance, field.attname)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{instance._meta.label} pk={instance.pk!r} has version {value!r}; the version "
            f"field {field.name!r} must hold the int the row was read at."
        )
    return value


def _conflict(instance: models.Model, expected: int, using: str | None = None) -> VersionConflict:
    """The error of a refused save or delete; ``using``: a save, whose row may be
    hidden by a filtering base manager (asked on refusal only)."""
    field = version_field(instance)
    owner = cast(type[models.Model], field.model)
    if using is not None and type(owner._base_manager) is not models.Manager:
        pk = getattr(instance, owner._meta.pk.attname)
        hidden: models.QuerySet[Any] = models.QuerySet(owner, using=using).filter(
            pk=pk, **{field.attname: expected}
        )
        if hidden.exists():
            return VersionConflict(
                f"{instance._meta.label} pk={instance.pk!r} is at the version it was read at "
                f"({expected}), but the model's base manager "
                f"({type(owner._base_manager).__name__}) does not show it; Django's save() "
                "writes through the base manager and would not update it either. Nothing "
                "was written.",
                instance=instance,
                expected_version=expected,
            )
    return VersionConflict(
        f"{instance._meta.label} pk={instance.pk!r} was changed or deleted since it was read "
        f"(expected version {expected}). Reload it, re-apply the change and save again.",
        instance=instance,
        expected_version=expected,
    )


def _validate_update_fields(instance: models.Model, update_fields: frozenset[str]) -> None:
    """Refuse names Django's save would refuse, with Django's message."""
    allowed: set[str] = set()
    for f in instance._meta.concrete_fields:
        if not f.primary_key:
            allowed.update((f.name, f.attname))
    _refuse_unknown(update_fields, allowed)


def _refuse_unknown(update_fields: frozenset[str], allowed: frozenset[str] | set[str]) -> None:
    unknown = update_fields - allowed
    if unknown:
        raise ValueError(
            "The following fields do not exist in this model, are m2m fields, primary keys, "
            "or are non-concrete fields: " + ", ".join(sorted(unknown))
        )


def _check_retry_arguments(attempts: Any, base: Any, cap: Any) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        raise TypeError(f"attempts must be an int (calls in all), not {attempts!r}.")
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1 (calls in all), not {attempts}.")
    for name, value in (("base", base), ("cap", cap)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number of seconds, not {value!r}.")
        if not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, not {value!r}.")
    if cap < base:
        raise ValueError(f"cap ({cap}) must be >= base ({base}): cap bounds every wait.")


@overload
def retry_on_conflict(
    func: Callable[P, R], *, attempts: int = ..., base: float = ..., cap: float = ...
) -> Callable[P, R]: ...


@overload
def retry_on_conflict(
    func: None = None, *, attempts: int = ..., base: float = ..., cap: float = ...
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def retry_on_conflict(
    func: Callable[P, R] | None = None,
    *,
    attempts: int = 5,
    base: float = 0.005,
    cap: float = 0.25,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Re-call the decorated function when it raises :class:`VersionConflict`,
    or when the database refused its transaction (see :func:`retryable`).

    Usable bare (``@retry_on_conflict``) or with arguments. Waits between
    calls grow exponentially with full jitter. The function must re-read
    what it modifies on every call: a retry that saves the same stale
    instance conflicts again. Works on ``async def`` functions too (waits
    with :func:`asyncio.sleep`). Under REPEATABLE READ or SERIALIZABLE, open
    the transaction inside the function: a stale save there is refused by
    the database (a serialization failure, an ``OperationalError``) rather
    than by the version check, and is retried too; called inside an outer
    ``transaction.atomic()`` block, such a refusal is raised at once.

    :param func: the function, when used bare.
    :param attempts: calls in all (>= 1), the first included.
    :param base: first wait's upper bound, in seconds (> 0).
    :param cap: upper bound of every wait, in seconds (>= base).
    :returns: the wrapped function (or a decorator, when ``func`` is not given).
    :raises TypeError, ValueError: bad arguments, at decoration time.

    The wrapped function returns what ``func`` returns and raises the last
    :class:`VersionConflict` (or refusal) once ``attempts`` calls all
    conflicted; any other exception propagates at once.
    """
    _check_retry_arguments(attempts, base, cap)

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        if not callable(function):
            raise TypeError(
                f"retry_on_conflict() wraps a function, not {function!r}; give the other "
                "arguments by keyword: @retry_on_conflict(attempts=5)."
            )
        if inspect.iscoroutinefunction(function):
            return cast(Callable[P, R], _async_retrying(function, attempts, base, cap))

        @functools.wraps(function)
        def retrying(*args: P.args, **kwargs: P.kwargs) -> R:
            backoff = Backoff(base, cap)
            for attempt in range(1, attempts + 1):
                try:
                    return function(*args, **kwargs)
                except (VersionConflict, OperationalError) as exc:
                    if attempt == attempts or not retryable(exc):
                        raise
                    _log_retry(function, attempt, attempts, exc)
                time.sleep(backoff.next_delay())
            raise AssertionError("unreachable")  # pragma: no cover

        return retrying

    return decorate if func is None else decorate(func)


def _async_retrying(
    function: Callable[..., Awaitable[Any]], attempts: int, base: float, cap: float
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(function)
    async def retrying(*args: Any, **kwargs: Any) -> Any:
        backoff = Backoff(base, cap)
        for attempt in range(1, attempts + 1):
            try:
                return await function(*args, **kwargs)
            except (VersionConflict, OperationalError) as exc:
                if attempt == attempts or not await sync_to_async(retryable)(exc):
                    raise
                _log_retry(function, attempt, attempts, exc)
            await asyncio.sleep(backoff.next_delay())
        raise AssertionError("unreachable")  # pragma: no cover

    return retrying


#: SQLSTATEs of a transaction the database refused as a whole, which a retry may win:
#: serialization_failure (REPEATABLE READ, SERIALIZABLE) and deadlock_detected.
_RETRY_SQLSTATES = frozenset({"40001", "40P01"})
#: SQLite's SQLITE_BUSY_SNAPSHOT: a DEFERRED transaction that read a snapshot
#: older than a commit made since cannot write (SQLite's serialization failure).
_SQLITE_BUSY_SNAPSHOT = 517


def retryable(exc: BaseException) -> bool:
    """Whether re-running the read-modify-write that raised ``exc`` can succeed.

    True for a :class:`VersionConflict`, and for a database's refusal of the
    whole transaction (a serialization failure under REPEATABLE READ or
    SERIALIZABLE, a deadlock, SQLite's ``SQLITE_BUSY_SNAPSHOT``) when no
    ``transaction.atomic()`` block is open on any connection of this thread:
    inside one, the transaction is already doomed, and only a retry of the
    whole block, outside it, can win.

    :param exc: the exception a save (or the transaction around it) raised.
    :returns: whether :func:`retry_on_conflict` and :func:`update_with_retry` retry it.
    """
    if isinstance(exc, VersionConflict):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__  # the driver's error (psycopg, psycopg2, sqlite3)
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    sqlite_code = getattr(cause, "sqlite_errorcode", None)
    if sqlstate not in _RETRY_SQLSTATES and sqlite_code != _SQLITE_BUSY_SNAPSHOT:
        return False
    return not any(c.in_atomic_block for c in connections.all(initialized_only=True))


def _log_retry(what: Any, attempt: int, attempts: int, exc: Exception) -> None:
    name = getattr(what, "__qualname__", repr(what))
    what_happened = (
        "version conflict" if isinstance(exc, VersionConflict) else "refused by the database"
    )
    logger.debug("%s: %s, retry %d of %d: %s", name, what_happened, attempt, attempts - 1, exc)


def update_with_retry(
    instance: M,
    change: Callable[[M], object],
    *,
    attempts: int = 5,
    base: float = 0.005,
    cap: float = 0.25,
    update_fields: Iterable[str] | None = None,
) -> M:
    """Apply ``change`` to ``instance`` and save it, re-reading and re-applying on conflict.

    Each round calls ``change(instance)`` then
    ``instance.save(update_fields=update_fields)``; after a conflict it waits
    (exponential backoff, full jitter), reloads the instance with
    ``refresh_from_db()`` and goes again. ``change`` must decide from the
    instance's current values (e.g. raise when the stock is 0): it sees
    fresh values on every round.

    :param instance: an instance of an :class:`OptimisticLockMixin` model.
    :param change: a callable modifying the instance in place; what it
        returns is ignored. If it raises, nothing is saved and the exception
        propagates.
    :param attempts: rounds in all (>= 1).
    :param base: first wait's upper bound, in seconds (> 0).
    :param cap: upper bound of every wait, in seconds (>= base).
    :param update_fields: passed to ``save()``; None saves every field.
    :returns: ``instance``, saved, its version bumped.
    :raises VersionConflict: the last conflict, after ``attempts`` rounds.
    :raises OperationalError: the database refused the save's transaction (see
        :func:`retryable`): after ``attempts`` rounds, or at once inside an
        outer ``transaction.atomic()`` block.
    :raises ObjectDoesNotExist: the row was deleted meanwhile (from ``refresh_from_db``).
    :raises TypeError, ValueError: bad arguments; nothing is called or saved.
    """
    if not isinstance(instance, OptimisticLockMixin):
        raise TypeError(
            f"update_with_retry() needs an instance of a model using OptimisticLockMixin, "
            f"not {instance!r}."
        )
    if not callable(change):
        raise TypeError(f"change must be a callable taking the instance, not {change!r}.")
    _check_retry_arguments(attempts, base, cap)
    if update_fields is not None:
        if isinstance(update_fields, str):
            raise TypeError("update_fields must be a list of field names, not a string.")
        update_fields = list(update_fields)
        _validate_update_fields(instance, frozenset(update_fields))
    backoff = Backoff(base, cap)
    for attempt in range(1, attempts + 1):
        change(instance)
        try:
            instance.save(update_fields=update_fields)
            return instance
        except (VersionConflict, OperationalError) as exc:
            if attempt == attempts or not retryable(exc):
                raise
            _log_retry(change, attempt, attempts, exc)
        time.sleep(backoff.next_delay())
        instance.refresh_from_db()
    raise AssertionError("unreachable")  # pragma: no cover
