"""A table taken away for a while, as on a database where ``migrate`` never created it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connections

from .conftest import psycopg_params


@contextmanager
def table_missing(database: str, table: str) -> Iterator[None]:
    """Rename ``table`` of the database alias ``database`` away within the block (committed,
    so every session sees it gone), and back after."""
    hidden = f"{table}_hidden"
    if connections[database].vendor == "postgresql":
        with psycopg.connect(**psycopg_params(database), autocommit=True) as side:
            side.execute("SET lock_timeout = '10s'")
            side.execute(f"ALTER TABLE {table} RENAME TO {hidden}")
            try:
                yield
            finally:
                side.execute(f"ALTER TABLE {hidden} RENAME TO {table}")
        return
    with connections[database].cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {hidden}")
    try:
        yield
    finally:
        with connections[database].cursor() as cursor:
            cursor.execute(f"ALTER TABLE {hidden} RENAME TO {table}")
