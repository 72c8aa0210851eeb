"""The audit trail as a record of past holds, for the lock-order checker across processes
(``ordering.orders_in``; ``manage.py distlock order``): each ended hold (kind
``released`` or ``lost``) with its holder (host, pid, thread or task), start and end."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.db import router

from django_distlock.ordering import PastHold

from .models import LockEvent

#: Rows read per query (the holds are streamed, grouped by holder).
CHUNK = 2000


def past_holds(since: datetime | None) -> Iterator[PastHold]:
    """The holds of the audit trail that ended since ``since`` (None: all), grouped by
    holder and sorted by start. Holds still open at their process' exit (kind
    ``acquired``: their end is not known) are left out, as the holds of an alias that
    samples (``AUDIT["SAMPLE"] < 1``) were when they were not drawn.

    :param since: the earliest end.
    :returns: the holds, read in chunks.
    """
    rows = LockEvent.objects.using(router.db_for_read(LockEvent)).filter(
        kind__in=(LockEvent.RELEASED, LockEvent.LOST), acquired_at__isnull=False
    )
    if since is not None:
        rows = rows.filter(at__gte=since)
    fields = ("host", "pid", "thread", "name", "acquired_at", "at", "context")
    for host, pid, thread, name, start, end, context in rows.order_by(
        "host", "pid", "thread", "acquired_at", "id"
    ).values_list(*fields).iterator(chunk_size=CHUNK):
        yield PastHold(f"{host} pid {pid} {thread}", name, start, end, context)
