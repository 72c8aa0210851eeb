"""Fenced updates of many rows (``FencedQuerySet.fenced_update()``) and the abstract
:class:`FencedModelMixin`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.db import models, transaction
from django.db.models import Count, F, Max, Q

import django_distlock.contrib.optimistic.fencing.fields as fields
from django_distlock.exceptions import StaleFencingToken
from django_distlock.handle import Lock
from django_distlock.leadership import Term

from .save import fenced_save

if TYPE_CHECKING:
    from django.db.models import Field

_M = TypeVar("_M", bound=models.Model)


class FencedQuerySet(models.QuerySet[_M]):
    """A QuerySet with :meth:`fenced_update`, for models with a :class:`FencingTokenField`."""

    def fenced_update(self, fence: Lock | Term | int, /, **values: Any) -> int:
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

        :param fence: a held :class:`~django_distlock.handle.Lock`, a leadership
            :class:`~django_distlock.leadership.Term` (its epoch) or an int token.
        :param values: the fields to set, as for ``update()`` (expressions allowed).
        :returns: the number of rows updated.
        :raises TypeError, ValueError: for bad arguments; nothing is written.
        :raises LockLost, LockNotHeld, UnsupportedOperation: see :func:`fencing_token_of`
            and :func:`fenced_save`; raised before any query.
        :raises StaleFencingToken: some row of the filter carries a higher token;
            nothing was written (``instance`` is None).
        """
        token_field = fields.fencing_field(self.model)
        token = fields.fencing_token_of(fence)
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
        fields.check_fence_scope(fence, using)
        qs = self.using(using)
        allowed = Q(**{f"{name}__isnull": True}) | Q(**{f"{name}__lte": token})
        version = fields.version_field_of(self.model)
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
        token_field: fields.FencingTokenField,
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

    fencing_token = fields.FencingTokenField()

    objects = FencedManager()

    class Meta:
        abstract = True

    def fenced_save(
        self,
        fence: Lock | Term | int,
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
            token_field = fields.fencing_field(self)
            deferred = self.get_deferred_fields()
            kwargs["update_fields"] = [
                f.attname
                for f in fields.writable_fields(type(self))
                if f is not token_field and f.attname not in deferred
            ]
        super().save(*args, **kwargs)
