"""The audit trail's part of an alias' health: an auditing alias' table must be
writable, or its events would be dropped."""

from __future__ import annotations

from django.db import DatabaseError, connections, router, transaction

from django_distlock.exceptions import BackendUnavailable, LockConfigurationError

from .conf import audit_for
from .models import LockEvent


def check_audit_table(alias: str) -> None:
    """Raise when ``alias`` audits and the audit table cannot be read (a probe of
    :data:`django_distlock.health.extra_probes`).

    :raises BackendUnavailable: when the table's database fails, or is not migrated.
    """
    try:
        if audit_for(alias) is None:
            return
    except LockConfigurationError:  # the check distlock.E003 reports it
        return
    database = router.db_for_write(LockEvent)
    # Within the caller's transaction (ATOMIC_REQUESTS), a savepoint keeps a failure
    # from breaking it.
    atomic = transaction.atomic(using=database) if connections[database].in_atomic_block else None
    try:
        if atomic is None:
            LockEvent.objects.using(database).exists()
        else:
            with atomic:
                LockEvent.objects.using(database).exists()
    except DatabaseError as exc:
        raise BackendUnavailable(
            f"The audit trail of lock alias {alias!r} cannot be written: database "
            f"{database!r} failed: {exc}. Run `manage.py migrate distlock_audit`."
        ) from exc
