"""Fenced saves: ``fenced_save()`` of one instance, its guarded UPDATE(s), and why a
refused one was refused."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from django.core.exceptions import ObjectDoesNotExist
from django.db import connections, models, router, transaction
from django.db.models import Q
from django.db.models.signals import post_save, pre_save

from django_distlock.exceptions import StaleFencingToken, VersionConflict
from django_distlock.handle import Lock
from django_distlock.leadership import Term

from .fields import (
    FencingTokenField,
    check_fence_scope,
    fencing_field,
    fencing_token_of,
    version_field_of,
    writable_fields,
)

if TYPE_CHECKING:
    from django.db.models import Field


def _fields_to_write(
    instance: models.Model, token_field: FencingTokenField, update_fields: Any, using: str
) -> list[Field[Any, Any]]:
    """Resolve ``update_fields`` the way ``Model.save()`` does, minus the token field."""
    writable = [f for f in writable_fields(type(instance)) if f is not token_field]
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
    fence: Lock | Term | int,
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

    :param fence: a held :class:`~django_distlock.handle.Lock`, a leadership
        :class:`~django_distlock.leadership.Term` (its epoch) or an int token.
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
        :class:`~django_distlock.contrib.optimistic.VersionField` and the row was
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
    check_fence_scope(fence, using)
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
    version = version_field_of(model)
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
