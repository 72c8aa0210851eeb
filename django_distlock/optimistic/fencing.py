"""Fenced writes: the storage refuses a write whose lock fencing token is stale.

Every grant of a lock key carries a fencing token that strictly increases
(:attr:`django_distlock.handle.Lock.fencing_token`). A model with a
:class:`FencingTokenField` records, per row, the token of the last fenced
write; :func:`fenced_save` and :meth:`FencedQuerySet.fenced_update` write only
when their token is not lower than that one, in the same statement, so a
holder paused past its lease cannot overwrite the work of the holder that
came after it. See ``docs/fencing.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.core.exceptions import ImproperlyConfigured, ObjectDoesNotExist
from django.db import connections, models, router, transaction
from django.db.models import Count, F, Max, Q
from django.db.models.signals import post_save, pre_save

from ..exceptions import (
    LockLost,
    LockNotHeld,
    StaleFencingToken,
    UnsupportedOperation,
    VersionConflict,
)
from ..handle import Lock
from .version import VersionField

if TYPE_CHECKING:
    from django.db.models import Field

__all__ = [
    "FencedManager",
    "FencedModelMixin",
    "FencedQuerySet",
    "FencingTokenField",
    "fenced_save",
    "fencing_field",
    "fencing_token_of",
]

_M = TypeVar("_M", bound=models.Model)
#: The largest value a ``BigIntegerField`` stores on every supported database.
_MAX_TOKEN = 2**63 - 1


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
        name, path, args, kwargs = super().deconstruct()
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


def fencing_token_of(fence: Lock | int) -> int:
    """Return the fencing token of ``fence``: a held lock handle or an int token.

    Only local state is checked (no I/O); whether the token is still the
    newest is decided by the storage, at the write.

    :raises TypeError: if ``fence`` is neither a :class:`~django_distlock.handle.Lock`
        nor an int (a bool is refused).
    :raises ValueError: if an int token is negative or does not fit a BIGINT.
    :raises LockLost: if the handle's lease is known, or must be assumed, gone.
    :raises LockNotHeld: if the handle does not hold its lock (never acquired, released).
    :raises UnsupportedOperation: if the handle's backend issues no fencing tokens.
    """
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
    if not 0 <= fence <= _MAX_TOKEN:
        raise ValueError(f"A fencing token is an int from 0 to 2**63 - 1, got {fence}.")
    return fence


def _check_fence_scope(fence: Lock | int, using: str) -> None:
    """Let the handle's backend refuse a write it cannot fence on ``using`` (transaction
    mode: a write outside the holding transaction), before any query."""
    if isinstance(fence, Lock):
        check = getattr(fence.backend, "check_fenced_write", None)
        if check is not None:
            check(fence, using)


def _version_field(model: type[models.Model]) -> Field[Any, Any] | None:
    """The model's optimistic-locking version column, if it has exactly one."""
    found = [f for f in model._meta.concrete_fields if isinstance(f, VersionField)]
    return found[0] if len(found) == 1 else None


def _non_pk_fields(model: type[models.Model]) -> list[Field[Any, Any]]:
    """Concrete fields an UPDATE of ``model`` may write (not the pk, not generated)."""
    return [
        f
        for f in model._meta.concrete_fields
        if not f.primary_key and not getattr(f, "generated", False)
    ]


def _fields_to_write(
    instance: models.Model, token_field: FencingTokenField, update_fields: Any, using: str
) -> list[Field[Any, Any]]:
    """Resolve ``update_fields`` the way ``Model.save()`` does, minus the token field."""
    writable = [f for f in _non_pk_fields(type(instance)) if f is not token_field]
    if update_fields is None:
        deferred = instance.get_deferred_fields() if using == instance._state.db else set()
        return [f for f in writable if f.attname not in deferred]
    if isinstance(update_fields, str) or not isinstance(update_fields, Iterable):
        raise TypeError("update_fields must be an iterable of field names (not a str) or None.")
    names = set(update_fields)
    if not names:
        raise ValueError("update_fields is empty: name the fields to write, or pass None.")
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"update_fields holds non-str items: {bad!r}.")
    known = {name for f in writable for name in (f.name, f.attname)}
    known |= {token_field.name, token_field.attname}  # always written; harmless to name
    unknown = sorted(names - known)
    if unknown:
        raise ValueError(
            f"update_fields names fields {type(instance)._meta.label} cannot write: "
            f"{', '.join(unknown)} (unknown, primary key, generated or not concrete)."
        )
    return [f for f in writable if f.name in names or f.attname in names]


def fenced_save(
    instance: models.Model,
    fence: Lock | int,
    *,
    update_fields: Iterable[str] | None = None,
    using: str | None = None,
) -> None:
    """Save ``instance`` only if no newer fencing token has written its row.

    An existing row (``instance._state.adding`` is False) is written with one
    ``UPDATE ... SET <fields>, <token> = t WHERE pk = %s AND (<token> IS NULL
    OR <token> <= t)``; equal tokens pass (the same holder writing twice). A
    multi-table-inheritance model gets one UPDATE per table in one
    transaction, the guarded one first (see :class:`_Tables`). A new object
    is inserted with the token, through ``save(force_insert=True)``.
    ``pre_save`` and ``post_save`` are sent as ``save()`` sends them; on
    success the instance's token attribute is ``t``.

    :param fence: a held :class:`~django_distlock.handle.Lock` or its int token.
    :param update_fields: the fields to write (names or attnames), as for
        ``save()``; the token is always written. Default: every loaded field.
        Not allowed for a new object.
    :param using: the database alias (default: the router's write database).
    :raises TypeError, ValueError: for bad arguments; nothing is sent or written.
    :raises LockLost, LockNotHeld, UnsupportedOperation: see :func:`fencing_token_of`;
        raised before any query. Also for a database transaction-mode handle whose
        write is not part of its holding transaction (see ``docs/fencing.md``).
    :raises StaleFencingToken: the row carries a higher token (a newer holder
        wrote it); nothing was written. ``pre_save`` was sent, ``post_save`` not.
    :raises DoesNotExist: (the model's) the row is gone; nothing was written.
        A fenced save never re-creates a deleted row.
    :raises VersionConflict: the model also has an optimistic
        :class:`~django_distlock.optimistic.VersionField` and the row was
        changed since the instance was read (a fenced write checks the version
        read and bumps it, so the two protections compose); nothing was written.
    """
    if not isinstance(instance, models.Model):
        raise TypeError(f"fenced_save() saves a model instance, not {type(instance).__name__}.")
    model = type(instance)
    token_field = fencing_field(model)
    token = fencing_token_of(fence)
    if using is None:
        using = router.db_for_write(model, instance=instance)
    elif not isinstance(using, str) or using not in connections:
        raise ValueError(f"using={using!r} is not a database alias of DATABASES.")
    _check_fence_scope(fence, using)
    adding = instance._state.adding
    if adding:
        if update_fields is not None:
            raise ValueError(
                "update_fields is for existing rows; this object is new and is inserted whole."
            )
        _fenced_insert(instance, token_field, token, using)
        return
    if instance.pk is None:
        raise ValueError(f"{model._meta.label} instance has no primary key; it cannot be updated.")
    fields = _fields_to_write(instance, token_field, update_fields, using)
    sent_fields = frozenset(update_fields) if update_fields is not None else None
    origin = model
    if not model._meta.auto_created:
        pre_save.send(
            sender=origin, instance=instance, raw=False, using=using, update_fields=sent_fields
        )
    pk = instance.pk
    name = token_field.attname
    version = _version_field(model)
    values = {f.attname: f.pre_save(instance, False) for f in fields if f is not version}
    values[name] = token
    allowed = Q(**{f"{name}__isnull": True}) | Q(**{f"{name}__lte": token})
    expected = 0
    if version is not None:  # optimistic locking too: check the version read and bump it
        expected = getattr(instance, version.attname)
        values[version.attname] = expected + 1
    base = model._base_manager.using(using)
    if not model._meta.parents:
        if version is not None:
            allowed &= Q(**{version.attname: expected})
        # The token check and the write are one statement: on PostgreSQL a
        # concurrent writer's row lock makes this UPDATE re-check the token on the
        # newest row version (READ COMMITTED re-evaluation); SQLite serialises writes.
        if base.filter(Q(pk=pk) & allowed).update(**values) == 0:
            raise _refusal(instance, base, token_field, token, version, expected, using)
    else:
        tables = _Tables(instance, token_field, token, version, expected, using)
        tables.write(base, allowed, values)
    setattr(instance, name, token)
    if version is not None:
        setattr(instance, version.attname, expected + 1)
    instance._state.db = using
    if not model._meta.auto_created:
        post_save.send(
            sender=origin,
            instance=instance,
            created=False,
            update_fields=sent_fields,
            raw=False,
            using=using,
        )


@dataclass(frozen=True)
class _Tables:
    """A fenced save of a multi-table-inheritance model: one UPDATE per table, in
    one transaction, the guarded ones first.

    The version's table (when the model has a version, in another table) is
    written first, guarded by the version, as a checked save writes it; then
    the token's table, guarded by the token. Each guarded UPDATE checks the
    newest row version and keeps the row locked (PostgreSQL; SQLite's write
    lock) until the commit, so no other fenced or checked writer gets between
    the check and the writes of the other tables.
    """

    instance: models.Model
    token_field: FencingTokenField
    token: int
    version: Field[Any, Any] | None
    expected: int
    using: str

    def write(self, base: models.QuerySet[Any], allowed: Q, values: dict[str, Any]) -> None:
        instance, version = self.instance, self.version
        owner = cast(type[models.Model], self.token_field.model)
        guarded: dict[type[models.Model], Q] = {}
        if version is not None:
            guarded[cast(type[models.Model], version.model)] = Q(**{version.attname: self.expected})
        guarded[owner] = guarded[owner] & allowed if owner in guarded else allowed
        by_table: dict[type[models.Model], dict[str, Any]] = {}
        for f in instance._meta.concrete_fields:
            if f.attname in values:
                table = cast(type[models.Model], f.model)
                by_table.setdefault(table, {})[f.attname] = values[f.attname]
        with transaction.atomic(using=self.using):
            for table, condition in guarded.items():
                if self._rows(table).filter(condition).update(**by_table.pop(table)) == 0:
                    raise self._refused(base)
            for table, table_values in by_table.items():
                self._rows(table).update(**table_values)

    def _refused(self, base: models.QuerySet[Any]) -> Exception:
        return _refusal(
            self.instance,
            base,
            self.token_field,
            self.token,
            self.version,
            self.expected,
            self.using,
        )

    def _rows(self, table: type[models.Model]) -> models.QuerySet[Any]:
        """The instance's row in ``table`` (its own table or a parent's)."""
        pk = getattr(self.instance, table._meta.pk.attname)
        return table._base_manager.using(self.using).filter(pk=pk)


def _refusal(
    instance: models.Model,
    base: models.QuerySet[Any],
    token_field: FencingTokenField,
    token: int,
    version: Field[Any, Any] | None,
    expected: int,
    using: str,
) -> Exception:
    """Why a guarded write matched no row: the one extra round trip, on refusal only."""
    model = type(instance)
    pk = instance.pk
    current = list(base.filter(pk=pk).values_list(token_field.attname, flat=True)[:1])
    if current and version is not None and (current[0] is None or current[0] <= token):
        return VersionConflict(
            f"{model._meta.label} pk={pk!r} was changed or deleted since it was read at "
            f"version {expected}: the fenced write was refused. Reload it and try again.",
            instance=instance,
            expected_version=expected,
        )
    if not current:
        missing: type[ObjectDoesNotExist] = getattr(model, "DoesNotExist", ObjectDoesNotExist)
        return missing(
            f"{model._meta.label} pk={pk!r} does not exist in {using!r}; the fenced "
            "save wrote nothing (a fenced save never re-creates a deleted row)."
        )
    return StaleFencingToken(
        f"{model._meta.label} pk={pk!r}: fenced write with token {token} refused, the row "
        f"carries token {current[0]}: a newer lock holder has written it. Nothing was "
        "written; this holder's lease is stale (re-acquire the lock and re-read the row).",
        instance=instance,
        token=token,
    )


def _fenced_insert(
    instance: models.Model, token_field: FencingTokenField, token: int, using: str
) -> None:
    """Insert a new object carrying ``token``; restore its token attribute on failure."""
    name = token_field.attname
    before = getattr(instance, name)
    setattr(instance, name, token)
    try:
        instance.save(force_insert=True, using=using)
    except BaseException:
        setattr(instance, name, before)
        raise


class FencedQuerySet(models.QuerySet[_M]):
    """A QuerySet with :meth:`fenced_update`, for models with a :class:`FencingTokenField`."""

    def fenced_update(self, fence: Lock | int, /, **values: Any) -> int:
        """Update every row of this queryset, all or nothing, guarded by ``fence``.

        In one transaction: ``UPDATE <table> SET <values>, <token> = t WHERE pk
        IN (<the filter's pks>) AND (<token> IS NULL OR <token> <= t)``, then
        one query for rows of the filter that carry a higher token. If there is
        any, a newer lock holder has written the data this queryset covers: the
        transaction is rolled back (nothing written) and
        :class:`StaleFencingToken` raised. A multi-table-inheritance model
        takes one guarded UPDATE of the token's table first (of the version's
        table before it, when the version lives in another table), which
        locks the rows, then the UPDATE of the values. No signals are sent (as
        for ``QuerySet.update()``).

        :param fence: a held :class:`~django_distlock.handle.Lock` or its int token.
        :param values: the fields to set, as for ``update()`` (expressions allowed).
        :returns: the number of rows updated.
        :raises TypeError, ValueError: for bad arguments; nothing is written.
        :raises LockLost, LockNotHeld, UnsupportedOperation: see :func:`fencing_token_of`
            and :func:`fenced_save`; raised before any query.
        :raises StaleFencingToken: some row of the filter carries a higher token;
            nothing was written (``instance`` is None).
        """
        token_field = fencing_field(self.model)
        token = fencing_token_of(fence)
        if not values:
            raise ValueError("fenced_update() needs at least one field to set.")
        name = token_field.attname
        if name in values or token_field.name in values:
            raise ValueError(f"fenced_update() sets {token_field.name!r} itself; do not pass it.")
        concrete = {n for f in self.model._meta.concrete_fields for n in (f.name, f.attname)}
        unknown = sorted(set(values) - concrete)
        if unknown:
            raise ValueError(
                f"fenced_update() cannot set {', '.join(unknown)}: not concrete fields of "
                f"{self.model._meta.label}."
            )
        if self.query.is_sliced:
            raise TypeError("Cannot update a query once a slice has been taken.")
        # select_for_update() only marks a clone for writing (no query runs), so
        # .db names the write database, where the transaction must be opened.
        using = self.select_for_update().db
        _check_fence_scope(fence, using)
        qs = self.using(using)
        allowed = Q(**{f"{name}__isnull": True}) | Q(**{f"{name}__lte": token})
        version = _version_field(self.model)
        if version is not None and version.name not in values and version.attname not in values:
            values[version.attname] = F(version.attname) + 1  # optimistic readers must notice
        with transaction.atomic(using=using):
            if not self.model._meta.parents:  # one table: values and token in one statement
                count = self._guarded(self.model, qs, using, allowed, {**values, name: token})
            else:
                count = self._update_tables(qs, using, token_field, token, allowed, version, values)
            # Rows this update wrote now carry ``token``; a higher one on a row
            # of the filter was refused, or written by a newer holder meanwhile.
            newer = qs.filter(**{f"{name}__gt": token}).aggregate(n=Count("pk"), top=Max(name))
            if newer["n"]:
                raise StaleFencingToken(
                    f"{self.model._meta.label}: fenced update with token {token} refused: "
                    f"{newer['n']} row(s) of the filter carry a newer token (up to "
                    f"{newer['top']}): a newer lock holder has written them. Nothing was "
                    "written; re-acquire the lock and re-read the rows.",
                    token=token,
                )
        return count

    def _update_tables(
        self,
        qs: models.QuerySet[Any],
        using: str,
        token_field: FencingTokenField,
        token: int,
        allowed: Q,
        version: Field[Any, Any] | None,
        values: dict[str, Any],
    ) -> int:
        """A multi-table-inheritance model: lock and write in the order of a fenced
        save (the version's table, the token's, then the others), so that the two
        never wait for each other's locks in a cycle."""
        name = token_field.attname
        owner = cast(type[models.Model], token_field.model)
        count = 0
        if version is not None and version.model is not owner:
            key = version.attname if version.attname in values else version.name
            bump = {version.attname: values.pop(key)}
            table = cast(type[models.Model], version.model)
            count = self._guarded(table, qs, using, Q(), bump)
        self._guarded(owner, qs, using, allowed, {name: token})
        if values:
            # Every row this writes was locked by the guarded UPDATE above.
            count = qs.filter(**{name: token}).update(**values)
        return count

    @staticmethod
    def _guarded(
        table: type[models.Model],
        qs: models.QuerySet[Any],
        using: str,
        condition: Q,
        values: dict[str, Any],
    ) -> int:
        """UPDATE the rows of ``qs`` in ``table`` (the model's or a parent's) that
        meet ``condition``, with the condition in the statement's own WHERE.

        PostgreSQL re-checks that WHERE on the newest version of a row that a
        concurrent writer changed; a condition inside a sub-select (where
        Django's ``update()`` puts the filter of a multi-table model or one with
        joins) is not re-checked. The rows written stay locked until the commit.
        """
        own = table._meta.concrete_model is qs.model._meta.concrete_model
        key = "pk" if own else table._meta.pk.name
        rows: models.QuerySet[Any] = models.QuerySet(table, using=using).filter(
            Q(pk__in=qs.values(key)) & condition
        )
        return rows.update(**values)


#: The manager of :class:`FencedQuerySet`: ``Model.objects.fenced_update(...)``.
FencedManager = models.Manager.from_queryset(FencedQuerySet, "FencedManager")


class FencedModelMixin(models.Model):
    """An abstract model whose rows take fenced writes.

    Adds ``fencing_token`` (a :class:`FencingTokenField`; rename it by setting
    ``fencing_token = None`` and declaring another FencingTokenField), the
    default manager ``objects`` (a :data:`FencedManager`), and
    :meth:`fenced_save`. A plain :meth:`save` still works and never writes
    the token column of an existing row (it is a bypass of the fence).
    """

    fencing_token = FencingTokenField()

    objects = FencedManager()

    class Meta:
        abstract = True

    def fenced_save(
        self,
        fence: Lock | int,
        *,
        update_fields: Iterable[str] | None = None,
        using: str | None = None,
    ) -> None:
        """Save unless a newer fencing token has written the row; see :func:`fenced_save`."""
        fenced_save(self, fence, update_fields=update_fields, using=using)

    fenced_save.alters_data = True  # type: ignore[attr-defined]

    def save(self, *args: Any, **kwargs: Any) -> None:
        """``Model.save()``, except that an UPDATE never writes the token column.

        So a plain save cannot lower the token a fenced write left (which
        would let a stale holder through); it does not check the token
        either. As a side effect an UPDATE passes explicit ``update_fields``
        (to the signals too), and raises instead of re-inserting a deleted row.
        """
        using = kwargs.get("using")
        if (
            not args
            and kwargs.get("update_fields") is None
            and not kwargs.get("force_insert")
            and not self._state.adding
            and using in (None, self._state.db)
        ):
            token_field = fencing_field(self)
            deferred = self.get_deferred_fields()
            kwargs["update_fields"] = [
                f.attname
                for f in _non_pk_fields(type(self))
                if f is not token_field and f.attname not in deferred
            ]
        super().save(*args, **kwargs)
