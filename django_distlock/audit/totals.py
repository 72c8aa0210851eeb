"""Sums of activity bucket rows, computed by the database: the activity page reads one
row per time bucket and one per (alias, name prefix) and histogram bucket, not one per
bucket row (a 7-day window of 80 prefixes is 6,720 rows, whose JSON the page would
otherwise decode one by one).

The histograms (JSON objects) are summed with ``jsonb_each_text`` on PostgreSQL and
``json_each`` on SQLite; on another database the rows' histograms are merged here.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import QuerySet, Sum

from ..models import LockActivity

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


def window(rows: QuerySet[LockActivity]) -> tuple[Any, Any, Histograms, Histograms]:
    """Everything the activity page shows of ``rows``: per start, per group, the wait
    and the hold histograms per group (four queries).

    :param rows: bucket rows of one span.
    :returns: (:func:`per_start`, :func:`per_group`, waits, holds).
    """
    return per_start(rows), per_group(rows), histograms(rows, "waits"), histograms(rows, "holds")
