"""The PL/pgSQL that ``migrate`` installs on PostgreSQL is exactly the live definitions
that ``django_distlock/migrations/sql/README.md`` names, file by file: a file edited
after its migration ran, a migration that installs other text, a routine added without
its line in the table, or a newer copy of a routine the table does not point to, fails
here."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from django.db import connections, transaction

from django_distlock import migrations as distlock_migrations

from .conftest import DATABASES, require_pg

pytestmark = pytest.mark.django_versions

on_pg = pytest.mark.django_db(transaction=True, databases=DATABASES)

SQL = Path(distlock_migrations.__file__).with_name("sql")
README = SQL / "README.md"
ROW = re.compile(r"^\| `(django_distlock_\w+)` \| `([\w.]+\.sql)` \|$", re.MULTILINE)
STATEMENT = re.compile(
    r"^CREATE OR REPLACE (?:FUNCTION|PROCEDURE) (django_distlock_\w+)\(.*?"
    r"\$fn\$(.*?)\$fn\$;",
    re.MULTILINE | re.DOTALL,
)
SCRATCH = "distlock_plpgsql_check"
#: The SHA-256 of each fixed copy, as its migration installs it on users' databases: an
#: edit of one would make a new database differ from one migrated before. A change is
#: a new file (and migration); add its digest here.
FIXED = {
    "0002_lease_handoff.sql": "86906b8e059c733012bcb7a0b62938f8395f1d61c47f0f0212ac06e0c386ed60",
    "0003_granted_after.sql": "db3da11ec70eb7b6c2ca956b4eeed3fdeaa8ee1c2b627f3bafa243dbe1cf527c",
    "0004_orphaned_reservations.sql": (
        "7600b7faca59b7f389a39a3af1393850c3cd07a77c7097d63b9797463141b6c4"
    ),
    "0009_share_routines.sql": (
        "b91b71520d06712365bf872657caae2af6de3cc1e7922c3534975db8e359ba00"
    ),
    "0011_prune_high_water.sql": (
        "2d083670a0a0197685439bac730defedb06e78b4b14c22db4e5410f6b4c4593f"
    ),
}


def live() -> dict[str, str]:
    """Routine name -> the file of its live definition, from the README's table."""
    table = dict(ROW.findall(README.read_text()))
    assert table, f"no table rows found in {README}"
    return table


def definitions(path: Path) -> dict[str, tuple[str, str]]:
    """Routine name -> (its whole CREATE statement, its body) in one file."""
    return {m[1]: (m[0], m[2]) for m in STATEMENT.finditer(path.read_text())}


def installed() -> dict[str, tuple[int, str, str]]:
    """Routine name -> (oid, schema, prosrc) of the django_distlock_* routines on "pg"."""
    with connections["pg"].cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, p.oid, n.nspname, p.prosrc FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE p.proname LIKE 'django\\_distlock\\_%%'"
        )
        rows = cursor.fetchall()
    names = [row[0] for row in rows]
    assert len(names) == len(set(names)), f"overloaded routines: {sorted(names)}"
    return {name: (oid, schema, source) for name, oid, schema, source in rows}


def test_the_fixed_copies_are_unchanged() -> None:
    found = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in SQL.glob("*.sql")}
    assert found == FIXED


def test_the_table_points_at_the_last_file_defining_each_routine() -> None:
    last: dict[str, str] = {}
    for path in sorted(SQL.glob("*.sql")):
        for name in definitions(path):
            last[name] = path.name
    assert live() == last


@on_pg
def test_the_installed_routines_are_the_live_files_text() -> None:
    require_pg()
    table, found = live(), installed()
    assert sorted(found) == sorted(table), "routines on the server vs the README's table"
    for name, file in table.items():
        body = definitions(SQL / file)[name][1]
        assert found[name][2] == body, f"{name}: the installed body differs from {file}"


@on_pg
def test_the_installed_headers_are_the_live_files_text() -> None:
    """Arguments, defaults, return type, language and options too: each file's
    statement is run in a scratch schema (rolled back) and ``pg_get_functiondef()``
    of the two compared."""
    require_pg()
    table, found = live(), installed()
    connection = connections["pg"]
    with transaction.atomic(using="pg"), connection.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA {SCRATCH}")
        cursor.execute(f"SET LOCAL search_path TO {SCRATCH}")
        for name, file in table.items():
            statement = definitions(SQL / file)[name][0]
            cursor.execute(statement.replace("%", "%%"))
            cursor.execute(
                "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n"
                " ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = %s",
                [SCRATCH, name],
            )
            expected = cursor.fetchone()[0]
            oid, schema = found[name][:2]
            cursor.execute("SELECT pg_get_functiondef(%s)", [oid])
            actual = cursor.fetchone()[0]
            assert actual == expected.replace(f"{SCRATCH}.", f"{schema}.", 1), name
        transaction.set_rollback(True, using="pg")
