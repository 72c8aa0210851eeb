"""Fenced writes moved to :mod:`django_distlock.fencing`; this path stays for the imports
and the migrations (``django_distlock.optimistic.fencing.FencingTokenField``) that name it."""

from ..fencing import (
    FencedManager,
    FencedModelMixin,
    FencedQuerySet,
    FencingTokenField,
    fenced_save,
    fencing_field,
    fencing_token_of,
)

__all__ = [
    "FencedManager",
    "FencedModelMixin",
    "FencedQuerySet",
    "FencingTokenField",
    "fenced_save",
    "fencing_field",
    "fencing_token_of",
]
