"""The model mixin of optimistic locking: ``save()`` and ``delete()`` check the version.

``save()`` of a row read earlier becomes one ``UPDATE ... WHERE pk = %s AND
version = %s`` that also bumps the version; when no row matches, somebody
else wrote (or deleted) the row since it was read, and
:class:`~django_distlock.exceptions.VersionConflict` is raised with nothing
written. Raw saves (fixtures, django-reversion) never lower a version. See
``docs/optimistic.md``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, ClassVar, Self, cast

from django.core import checks
from django.db import connections, models, router, transaction
from django.db.models.base import ModelBase
from django.db.models.signals import class_prepared, post_save, pre_save

from django_distlock.exceptions import VersionConflict

from .saveplan import SavePlan, direct_update, plan_for
from .version import (
    KEY_ASSIGNED,
    VersionField,
    clock_version,
    count_message,
    version_field,
    version_fields,
)

__all__ = ["OptimisticLockMixin"]

#: Attribute of an instance's ``_state``: the primary key its row was read (or saved) with.
_READ_PK = "distlock_read_pk"
_UNKNOWN = object()  # no primary key was noted (not loaded by from_db, never saved by us)


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

    #: Read by VersionField's check: a model of this class checks its version.
    _distlock_checked_saves: ClassVar[bool] = True

    class Meta:
        abstract = True

    @classmethod
    def check(cls, **kwargs: Any) -> list[checks.CheckMessage]:
        messages = super().check(**kwargs)
        found = version_fields(cls)
        if len(found) != 1:
            messages.append(checks.Error(count_message(cls, found), obj=cls, id="distlock.E101"))
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
        A new row starts at the field's initial version (1) when the database
        assigns its key, at the clock when the key is given (it may be a
        deleted row's; see :class:`VersionField`), whatever version the
        instance carries. A new instance
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
        plan = plan_for(type(self))
        if update_fields is not None:
            update_fields = frozenset(update_fields)
            if not update_fields:
                return  # like Django: an empty update_fields saves nothing and sends no signal
            refuse_unknown_fields(update_fields, plan.allowed)
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
        plan = plan_for(type(self))
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
        # The version's table is keyed by a parent link, which Django sets from the
        # parent row it inserts before that table: VersionField.pre_save then finds
        # a key set, and only this moment tells whether the database gave it. (A key
        # that a pre_save receiver sets on such a child after this is not seen.)
        assigned = bool(plan.key_sources) and all(
            getattr(self, name) is None for name in plan.key_sources
        )
        if assigned:
            setattr(self._state, KEY_ASSIGNED, True)
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
        finally:
            if assigned:
                delattr(self._state, KEY_ASSIGNED)
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
    """Before a raw save (``loaddata``, django-reversion's revert): never give a
    row a version that a reader may hold.

    A raw save writes the version the instance carries, read from a fixture or
    a stored revision: often lower than the row's, which would let the readers
    of an older version win again. It becomes the row's version plus one (the
    raw save is a write: readers before it must conflict), or the instance's
    when that is higher. A new row (a deleted row recovered, a fixture) may
    reuse the key of a deleted row whose readers hold its versions: it starts
    at :func:`clock_version`, or the instance's version when that is higher.
    One query, on raw saves only; in a transaction (``loaddata`` and
    reversion's revert run in one) it locks the row until the commit.
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
    loaded = getattr(instance, field.attname)
    loaded = loaded if isinstance(loaded, int) and not isinstance(loaded, bool) else 0
    # A new row (a recovered deletion, a fixture) may reuse a deleted row's key: the clock
    # puts it above every version that row reached (see VersionField).
    setattr(instance, field.attname, max(stored[0] + 1 if stored else clock_version(), loaded))


def _guard_raw_saves(sender: type[models.Model], **kwargs: Any) -> None:
    """Connect :func:`_keep_the_version_newest` to each concrete optimistic model."""
    if issubclass(sender, OptimisticLockMixin) and not sender._meta.abstract:
        pre_save.connect(_keep_the_version_newest, sender=sender, weak=False)


class_prepared.connect(_guard_raw_saves)


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


def validate_update_fields(instance: models.Model, update_fields: frozenset[str]) -> None:
    """Refuse names Django's save would refuse, with Django's message."""
    allowed: set[str] = set()
    for f in instance._meta.concrete_fields:
        if not f.primary_key:
            allowed.update((f.name, f.attname))
    refuse_unknown_fields(update_fields, allowed)


def refuse_unknown_fields(
    update_fields: frozenset[str], allowed: frozenset[str] | set[str]
) -> None:
    unknown = update_fields - allowed
    if unknown:
        raise ValueError(
            "The following fields do not exist in this model, are m2m fields, primary keys, "
            "or are non-concrete fields: " + ", ".join(sorted(unknown))
        )
