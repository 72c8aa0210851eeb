"""The checked ``UPDATE`` of an optimistic save, as the SQL Django would compile.

:class:`SavePlan` is what a checked save of one model class needs, worked
out once per class by :func:`plan_for`;
:func:`direct_update` runs its statement through Django's cursor (logged,
wrapped and error-mapped as any query), or declines when the model or a
value needs Django's compiler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from .version import VersionField, count_message

#: Cached statements per model class at most (distinct update_fields sets x backends).
STATEMENTS_PER_MODEL = 64


@dataclass(frozen=True, slots=True)
class Statement:
    """The checked ``UPDATE`` of one model, one backend and one ``update_fields``."""

    #: ``UPDATE t SET c = %s, ..., version = %s WHERE pk = %s AND version = %s``, or
    #: "" when the model needs the ORM's compiler (see :attr:`SavePlan.direct`).
    sql: str
    #: (field, whether its pre_save() is its own) of each column set, the version excluded.
    columns: tuple[tuple[models.Field[Any, Any], bool], ...]


@dataclass(frozen=True, slots=True)
class SavePlan:
    """What a checked save of one model class needs, worked out once per class."""

    #: The class's ``_meta.concrete_fields`` this plan was built from; Django
    #: builds a new tuple when it expires the model's metadata, which rebuilds the plan.
    source: tuple[models.Field[Any, Any], ...]
    field: models.Field[Any, Any]  # the VersionField
    owner: type[models.Model]  # the model whose table holds the version column
    owner_pk: str  # attname of the owner's primary key
    has_parents: bool  # multi-table inheritance: Django's save writes the parents
    #: When the owner's key is a parent link: the keys and links of the model's
    #: tables, all None before an insert when the database assigns that key; else ().
    key_sources: tuple[str, ...]
    #: (name, attname, field, own pre_save) of each column a save writes, but the
    #: pk, generated columns and the version.
    columns: tuple[tuple[str, str, models.Field[Any, Any], bool], ...]
    allowed: frozenset[str]  # names and attnames update_fields may hold
    #: True when the UPDATE Django's compiler would write is known in advance:
    #: the default base manager (no filtering), one pk column compared with
    #: Django's own ``exact``, no field with a custom SQL placeholder.
    direct: bool
    #: (backend's operations class, update_fields) -> statement.
    statements: dict[tuple[type, frozenset[str] | None], Statement]

    def statement(
        self, connection: BaseDatabaseWrapper, update_fields: frozenset[str] | None
    ) -> Statement:
        """The statement of a save with ``update_fields`` on ``connection``, cached."""
        key = (type(connection.ops), update_fields)
        found = self.statements.get(key)
        if found is not None:
            return found
        columns = tuple(
            (f, own)
            for name, attname, f, own in self.columns
            if update_fields is None or name in update_fields or attname in update_fields
        )
        sql = ""
        if self.direct:
            qn = connection.ops.quote_name
            sets = ", ".join(f"{qn(cast(str, f.column))} = %s" for f, _ in columns)
            version = qn(cast(str, self.field.column))
            pk = qn(cast(str, self.owner._meta.pk.column))
            sql = (
                f"UPDATE {qn(self.owner._meta.db_table)} SET "
                f"{sets}{', ' if sets else ''}{version} = %s WHERE {pk} = %s AND {version} = %s"
            )
        statement = Statement(sql, columns)
        if len(self.statements) < STATEMENTS_PER_MODEL:
            self.statements[key] = statement
        return statement


def direct_ok(
    owner: type[models.Model], field: models.Field[Any, Any], columns: list[models.Field[Any, Any]]
) -> bool:
    """Whether Django would write the checked save as the plain SQL of :class:`Statement`."""
    pk = owner._meta.pk
    return (
        type(owner._base_manager) is models.Manager  # its queryset adds no condition
        and isinstance(pk.column, str)  # one pk column (not a composite primary key)
        # Django's own exact lookup compiles to "column = %s" (a field's own one may not).
        and all(getattr(f.get_lookup("exact"), "__module__", None) == _LOOKUPS for f in (pk, field))
        and not any(
            hasattr(f, "get_placeholder") or hasattr(f, "get_placeholder_sql")
            for f in (*columns, field)
        )
    )


_LOOKUPS = "django.db.models.lookups"


def key_sources(concrete: type[models.Model], owner: type[models.Model]) -> tuple[str, ...]:
    """The attributes whose values, all None before Django's save inserts ``concrete``,
    mean that the database assigns the key of ``owner``'s row (see :class:`SavePlan`).

    Django's save copies a key or link given anywhere in the chain of parents to
    the root's key, and the root's key back into every link: any one given is
    the key given. A root key from a default (Python or database) or from a
    field that makes its own (``get_pk_value_on_save``) is a key given too:
    then () (VersionField decides from the key, which it finds set).
    """
    if owner._meta.pk not in owner._meta.parents.values():
        return ()  # the owner's key is its own: None at its insert when the database assigns it
    tables = (concrete, *concrete._meta.all_parents)
    for model in tables:
        pk = model._meta.pk
        if not model._meta.parents and (
            pk.has_default()
            or pk.has_db_default()
            or type(pk).get_pk_value_on_save is not models.Field.get_pk_value_on_save
        ):
            return ()
    names = {model._meta.pk.attname for model in tables}
    names.update(link.attname for model in tables for link in model._meta.parents.values() if link)
    return tuple(sorted(names))


def direct_update(
    connection: BaseDatabaseWrapper,
    plan: SavePlan,
    statement: Statement,
    values: list[tuple[models.Field[Any, Any], Any]],
    pk: Any,
    expected: int,
) -> int | None:
    """Run the checked UPDATE as the SQL Django would compile; rows written, or None.

    None (nothing run) when the model or a value needs Django's compiler:
    an expression, a model instance, a value whose database form is SQL.
    Skipping the compiler is what makes this save cost about what Django's
    own save costs, although it has one more condition and one more column.
    """
    if not statement.sql:
        return None
    params = []
    for f, value in values:
        if hasattr(value, "resolve_expression") or hasattr(value, "prepare_database_save"):
            return None
        value = f.get_db_prep_save(value, connection=connection)
        if hasattr(value, "as_sql"):
            return None
        params.append(value)
    field = plan.field
    params.append(field.get_db_prep_save(expected + 1, connection=connection))
    params.append(plan.owner._meta.pk.get_db_prep_value(pk, connection, prepared=False))
    params.append(field.get_db_prep_value(expected, connection, prepared=False))
    # What QuerySet.update() does around its query: an error inside atomic() marks it for rollback.
    with transaction.mark_for_rollback_on_error(connection.alias), connection.cursor() as cursor:
        cursor.execute(statement.sql, params)
        return cast(int, cursor.rowcount)


_PLAN = "_distlock_save_plan"  # the class attribute caching a model's plan


def plan_for(model: type[models.Model]) -> SavePlan:
    """The model's save plan, from the cache on the class when it is still current.

    :raises ImproperlyConfigured: the model has no VersionField, or more than one.
    """
    source = model._meta.concrete_fields
    plan = model.__dict__.get(_PLAN)  # not a parent's (a proxy has its own)
    if plan is not None and plan.source is source:
        return cast(SavePlan, plan)
    found: list[models.Field[Any, Any]] = [f for f in source if isinstance(f, VersionField)]
    if len(found) != 1:
        raise ImproperlyConfigured(count_message(model, found))
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
        key_sources=key_sources(concrete, owner),
        columns=columns,
        allowed=frozenset(
            name for f in source if not f.primary_key for name in (f.name, f.attname)
        ),
        direct=direct_ok(owner, field, [f for _, _, f, _ in columns]),
        statements={},
    )
    setattr(model, _PLAN, plan)  # a class attribute: it lives and dies with the class
    return plan
