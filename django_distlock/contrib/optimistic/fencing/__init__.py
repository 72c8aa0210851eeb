"""Fenced writes: the storage refuses a write whose lock fencing token is stale.

Every grant of a lock key carries a fencing token that strictly increases
(:attr:`django_distlock.handle.Lock.fencing_token`). A model with a
:class:`FencingTokenField` records, per row, the token of the last fenced
write; :func:`fenced_save` and :meth:`FencedQuerySet.fenced_update` write only
when their token is not lower than that one, in the same statement, so a
holder paused past its lease cannot overwrite the work of the holder that
came after it. See ``docs/fencing.md``.

The modules of this package:

- :mod:`.fields`: :class:`FencingTokenField`, :func:`fencing_field`, :func:`fencing_token_of`;
- :mod:`.save`: :func:`fenced_save`, the guarded UPDATE of one instance;
- :mod:`.queryset`: :class:`FencedQuerySet`, :data:`FencedManager`, :class:`FencedModelMixin`.
"""

from .fields import FencingTokenField, fencing_field, fencing_token_of
from .queryset import FencedManager, FencedModelMixin, FencedQuerySet
from .save import fenced_save

__all__ = [
    "FencedManager",
    "FencedModelMixin",
    "FencedQuerySet",
    "FencingTokenField",
    "fenced_save",
    "fencing_field",
    "fencing_token_of",
]
