"""Sums of activity bucket rows, computed by the database: the activity page reads one
row per time bucket and one per (alias, name prefix) and histogram bucket, not one per
bucket row (a 7-day window of 4 aliases and 20 prefixes is 6,720 rows, whose JSON the
page would otherwise decode one by one); the histograms only of the groups it shows.

The histograms (JSON objects) are summed with ``jsonb_each_text`` on PostgreSQL and
``json_each`` on SQLite; on another database the rows' histograms are merged here.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from datetime import datetime
from functools import reduce
from typing import Any

from django.db import connections
from django.db.models import Q, QuerySet, Sum

from .models import LockActivity

#: The count columns of a bucket row.
COUNTS = ("acquired", "failed", "lost", "forced")
#: Per vendor: the SQL that sums one histogram column (``{column}``) of the rows the
#: subquery (``{rows}``: their alias, prefix and that column) selects, per alias, prefix
#: and histogram bucket.
_HISTOGRAM_SQL = {
    "postgresql": (
        "SELECT a.alias, a.prefix, h.key, SUM(h.value::bigint) FROM ({rows}) a "
        "CROSS JOIN LATERAL jsonb_each_text(a.{column}) h GROUP BY a.alias, a.prefix, h.key"
    ),
    "sqlite": (
        "SELECT a.alias, a.prefix, h.key, SUM(h.value) FROM ({rows}) a, json_each(a.{column}) h "
        "GROUP BY a.alias, a.prefix, h.key"
    ),
}

Histograms = dict[tuple[str, str], dict[str, int]]


def per_start(rows: QuerySet[LockActivity]) -> list[tuple[datetime, dict[str, int]]]:
    """The counts of ``rows`` summed per bucket start.

    :param rows: bucket rows of one span.
    :returns: (start, {count column: sum}) pairs.
    """
    sums: Any = rows.values("start").annotate(**{f"n_{c}": Sum(c) for c in COUNTS})
    return [(row["start"], {c: row[f"n_{c}"] or 0 for c in COUNTS}) for row in sums.order_by()]


def per_group(rows: QuerySet[LockActivity]) -> dict[tuple[str, str], dict[str, int]]:
    """The counts of ``rows`` summed per (alias, prefix).

    :param rows: bucket rows.
    :returns: {(alias, prefix): {count column: sum}}.
    """
    sums: Any = rows.values("alias", "prefix").annotate(**{f"n_{c}": Sum(c) for c in COUNTS})
    return {
        (row["alias"], row["prefix"]): {c: row[f"n_{c}"] or 0 for c in COUNTS}
        for row in sums.order_by()
    }


def histograms(rows: QuerySet[LockActivity], column: str) -> Histograms:
    """The histogram ``column`` (``waits`` or ``holds``) of ``rows`` summed per
    (alias, prefix), by the database where it can.

    :param rows: bucket rows.
    :param column: ``"waits"`` or ``"holds"``.
    :returns: {(alias, prefix): {histogram bucket: count}}.
    """
    if column not in ("waits", "holds"):
        raise ValueError(f"no histogram column {column!r}")
    summed: Histograms = defaultdict(dict)
    connection = connections[rows.db]
    template = _HISTOGRAM_SQL.get(connection.vendor)
    if template is None:
        for alias, prefix, histogram in rows.values_list("alias", "prefix", column):
            mine = summed[(alias, prefix)]
            for index, count in histogram.items():
                mine[index] = mine.get(index, 0) + count
        return summed
    selected = rows.values("alias", "prefix", column).order_by()
    sub, params = selected.query.get_compiler(using=rows.db).as_sql()
    sql = template.format(rows=sub, column=connection.ops.quote_name(column))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for alias, prefix, index, count in cursor.fetchall():
            summed[(alias, prefix)][str(index)] = int(count)
    return summed


def busiest(counts: dict[tuple[str, str], dict[str, int]]) -> list[tuple[str, str]]:
    """The groups of :func:`per_group`'s ``counts``, the busiest first (ties: by alias
    and prefix).

    :param counts: {(alias, prefix): {count column: sum}}.
    :returns: the (alias, prefix) keys in that order.
    """
    return sorted(counts, key=lambda key: (-sum(counts[key].values()), key))


def of_groups(
    rows: QuerySet[LockActivity], groups: list[tuple[str, str]]
) -> QuerySet[LockActivity]:
    """The rows of ``rows`` whose (alias, prefix) is one of ``groups``.

    :param rows: bucket rows.
    :param groups: (alias, prefix) keys.
    :returns: the rows of those groups (none when ``groups`` is empty).
    """
    if not groups:
        return rows.none()
    return rows.filter(reduce(operator.or_, (Q(alias=a, prefix=p) for a, p in groups)))


def window(
    rows: QuerySet[LockActivity], shown: int | None = None
) -> tuple[Any, Any, Histograms, Histograms]:
    """Everything the activity page shows of ``rows``: per start, per group, the wait
    and the hold histograms (four queries) of the ``shown`` busiest groups.

    Summing a histogram expands each of its rows' slots (up to ``len(BOUNDS) + 1``, and
    more of them the more events a row counts), so the histograms of the groups not
    shown are not read: their cost stays ``shown x buckets x slots`` however many
    aliases and prefixes the window has.

    :param rows: bucket rows of one span.
    :param shown: the number of groups whose histograms are read, the busiest (None:
        every group's).
    :returns: (:func:`per_start`, :func:`per_group`, waits, holds).
    """
    counts = per_group(rows)
    if shown is not None and len(counts) > shown:
        rows_shown = of_groups(rows, busiest(counts)[:shown])
    else:
        rows_shown = rows
    waits, holds = histograms(rows_shown, "waits"), histograms(rows_shown, "holds")
    return per_start(rows), counts, waits, holds
