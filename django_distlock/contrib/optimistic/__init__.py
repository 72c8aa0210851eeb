"""Optimistic locking: a version column checked by every save and delete, and retry helpers.

No lock server: a model using :class:`OptimisticLockMixin` gets a version
column, and ``save()`` of a row read earlier writes only if that version is
still the row's (:class:`VersionConflict` otherwise, nothing written).
:func:`retry_on_conflict` and :func:`update_with_retry` re-run a
read-modify-write until it wins. See ``docs/optimistic.md``.

The modules of this package:

- :mod:`.version`: :class:`VersionField`, :func:`version_field`, :func:`get_version`;
- :mod:`.mixin`: :class:`OptimisticLockMixin`, the checked save and delete;
- :mod:`.saveplan`: the checked ``UPDATE`` a save sends, worked out once per model;
- :mod:`.retry`: :func:`retry_on_conflict`, :func:`update_with_retry`, :func:`retryable`;
- :mod:`.admin` and :mod:`.admin_forms`: concurrent-edit detection in the Django
  admin (``docs/optimistic-admin.md``).
"""

from django_distlock.exceptions import VersionConflict

from .mixin import OptimisticLockMixin
from .retry import retry_on_conflict, retryable, update_with_retry
from .version import VersionField, get_version, version_field

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
