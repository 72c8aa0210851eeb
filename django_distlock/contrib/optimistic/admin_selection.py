"""The check an admin action makes before it runs on rows of an optimistic-locking
model: every selected row must still be at the version its list showed (see
:class:`~django_distlock.contrib.optimistic.admin.OptimisticAdminMixin`'s ``response_action``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.core import signing
from django.core.exceptions import ValidationError
from django.db import models
from django.http import HttpRequest

from .admin_forms import ACTION_VERSION_PREFIX, VERSION_FORM_FIELD, SignedRead, unsign_version
from .version import version_field

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin


def quoted(names: Iterable[str]) -> str:
    """The names, quoted, joined by commas."""
    return ", ".join(f"“{name}”" for name in names)


def these(count: int, singular: str, plural: str) -> str:
    """``singular`` for one, else ``plural``."""
    return singular if count == 1 else plural


@dataclass
class SelectionCheck:
    """The check of the rows an action is about to act on (see ``response_action``)."""

    admin: ModelAdmin[Any]
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
                parts.append(f"changed {quoted(changed)}")
            if deleted:
                parts.append(f"deleted {quoted(deleted)}")
            count = len(changed) + len(deleted)
            return (
                f"The action was not run: someone else {' and '.join(parts)} since the list "
                f"was shown. The list below shows {these(count, 'it', 'them')} as "
                f"{these(count, 'it is', 'they are')} now: check, then select again."
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
