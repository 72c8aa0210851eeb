"""Deleting old rows of the audit trail (``manage.py distlock purge``)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.utils import timezone

from ..handler import locks
from ..models import LockEvent

#: Days kept of an alias that does not audit (now), when no ``days`` is given.
DEFAULT_RETENTION_DAYS = 30.0


def purge(days: float | None = None, *, now: datetime | None = None) -> int:
    """Delete the audit rows older than ``days``, or, with no ``days``, each alias'
    rows older than its ``AUDIT['RETENTION_DAYS']`` (30 days for an alias that does
    not audit now; none of an alias whose ``RETENTION_DAYS`` is None).

    :param days: the age, in days, of the oldest row kept, of every alias; None: per alias.
    :param now: the moment ages are counted from (default: now).
    :returns: how many rows were deleted.
    :raises ValueError: when ``days`` is negative, not finite, or reaches before year 1.
    """
    now = timezone.now() if now is None else now
    if days is not None:
        if not math.isfinite(days) or days < 0:
            raise ValueError(f"days must be a number >= 0, got {days}.")
        try:
            cutoff = now - timedelta(days=days)
        except OverflowError as exc:
            raise ValueError(f"days {days} reaches before year 1.") from exc
        return LockEvent.objects.filter(at__lt=cutoff).delete()[0]
    deleted = 0
    for alias in locks:
        audit = locks[alias].audit
        keep = DEFAULT_RETENTION_DAYS if audit is None else audit.retention_days
        if keep is not None:
            old = LockEvent.objects.filter(alias=alias, at__lt=now - timedelta(days=keep))
            deleted += old.delete()[0]
    return deleted
