"""Deleting old rows of the audit trail (``manage.py distlock_audit purge``, the Celery task
``django_distlock.contrib.audit.tasks.purge_audit``).

A routine purge keeps the operators' actions (force releases, purges:
``LockEvent.OPERATOR_KINDS``); only ``operator_actions=True`` deletes those, with their
own age. Every purge that deletes writes a ``purged`` row saying who, when and how many.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.db import router, transaction
from django.db.models import Q
from django.utils import timezone

from django_distlock.handler import locks

from .buckets import KEEP
from .conf import audit_for
from .models import LockActivity, LockEvent

#: Days kept of an alias that does not audit (now), when no ``days`` is given.
DEFAULT_RETENTION_DAYS = 30.0


def _cutoff(now: datetime, days: float) -> datetime:
    if not math.isfinite(days) or days < 0:
        raise ValueError(f"days must be a number >= 0, got {days}.")
    try:
        return now - timedelta(days=days)
    except OverflowError as exc:
        raise ValueError(f"days {days} reaches before year 1.") from exc


def _delete(alias: str | None, cutoff: datetime, operator_actions: bool) -> int:
    """Delete the rows (of ``alias``; None: every alias) older than ``cutoff`` and their
    activity buckets; the operators' actions only with ``operator_actions``."""
    old = LockEvent.objects.filter(at__lt=cutoff)
    activity = LockActivity.objects.filter(start__lt=cutoff)
    if alias is not None:
        old, activity = old.filter(alias=alias), activity.filter(alias=alias)
    if not operator_actions:
        old = old.exclude(Q(kind__in=LockEvent.OPERATOR_KINDS) | ~Q(actor=""))
    activity.delete()
    return old.delete()[0]


def purge(
    days: float | None = None,
    *,
    now: datetime | None = None,
    operator_actions: bool = False,
    actor: str = "",
) -> int:
    """Delete the audit rows older than ``days``, or, with no ``days``, each alias'
    rows older than its ``AUDIT['RETENTION_DAYS']`` (30 days for an alias that does
    not audit now; none of an alias whose ``RETENTION_DAYS`` is None), and their
    activity buckets (and the buckets of the short spans past ``buckets.KEEP``). Force
    releases and purges are kept unless ``operator_actions``
    (then they go with ``days``, or :data:`DEFAULT_RETENTION_DAYS`). A purge that
    deletes rows is itself recorded (kind ``purged``, by ``actor``).

    :param days: the age, in days, of the oldest row kept, of every alias; None: per alias.
    :param now: the moment ages are counted from (default: now).
    :param operator_actions: delete the force releases and purges too.
    :param actor: who purges, for the ``purged`` row (``command:<user>``, ``task:...``).
    :returns: how many rows were deleted.
    :raises ValueError: when ``days`` is negative, not finite, or reaches before year 1.
    """
    now = timezone.now() if now is None else now
    deleted, spans = 0, []
    # One transaction on the databases the audit tables are routed to (not "default").
    with (
        transaction.atomic(using=router.db_for_write(LockEvent)),
        transaction.atomic(using=router.db_for_write(LockActivity)),
    ):
        if days is not None:
            cutoff = _cutoff(now, days)
            deleted = _delete(None, cutoff, operator_actions)
            spans.append(f"older than {days:g} days")
        else:
            for alias in locks:
                audit = audit_for(alias)
                keep = DEFAULT_RETENTION_DAYS if audit is None else audit.retention_days
                if keep is not None:
                    deleted += _delete(alias, _cutoff(now, keep), False)
                    spans.append(f"{alias} older than {keep:g} days")
            if operator_actions:
                deleted += _delete(None, _cutoff(now, DEFAULT_RETENTION_DAYS), True)
                spans.append(f"operator actions older than {DEFAULT_RETENTION_DAYS:g} days")
        for span, kept in KEEP.items():  # the short spans serve the short windows only
            if kept is not None:
                LockActivity.objects.filter(span=span, start__lt=now - kept).delete()
        if deleted:
            LockEvent.objects.create(
                at=timezone.now(),
                kind=LockEvent.PURGED,
                alias="",
                name="",
                actor=actor[:150],
                reason=f"deleted {deleted} rows: {'; '.join(spans)}"
                + (" (force releases and purges included)" if operator_actions else ""),
            )
    return deleted
