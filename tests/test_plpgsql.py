"""The PL/pgSQL that ``migrate`` installs on PostgreSQL is exactly the text of
``django_distlock/sql/postgresql.sql``: a routine on the server that the file does not
define, a file edited without its migration, or a migration that installs other text,
fails here. So do the tables, the sequence and the trigger the file creates, when
missing after ``migrate``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connections, transaction

import django_distlock

from .conftest import LIBRARY_DB, require_pg

pytestmark = pytest.mark.django_versions

on_pg = LIBRARY_DB

FILE = Path(django_distlock.__file__).with_name("sql") / "postgresql.sql"
STATEMENT = re.compile(
    r"^CREATE OR REPLACE (?:FUNCTION|PROCEDURE) (django_distlock_\w+)\(.*?"
    r"\$fn\$(.*?)\$fn\$;",
    re.MULTILINE | re.DOTALL,
)
SCRATCH = "distlock_plpgsql_check"


def definitions() -> dict[str, tuple[str, str]]:
    """Routine name -> (its whole CREATE statement, its body), from the file."""
    found = [(m[1], (m[0], m[2])) for m in STATEMENT.finditer(FILE.read_text())]
    names = [name for name, _ in found]
    assert len(names) == len(set(names)), f"defined twice: {sorted(names)}"
    return dict(found)


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


@on_pg
def test_the_installed_routines_are_the_live_files_text() -> None:
    require_pg()
    table, found = definitions(), installed()
    assert table, f"no routine found in {FILE}"
    assert sorted(found) == sorted(table), "routines on the server vs the file's"
    for name, (_, body) in table.items():
        assert found[name][2] == body, f"{name}: the installed body differs from the file"


@on_pg
def test_the_installed_headers_are_the_live_files_text() -> None:
    """Arguments, defaults, return type, language and options too: the file's
    statement is run in a scratch schema (rolled back) and ``pg_get_functiondef()``
    of the two compared."""
    require_pg()
    table, found = definitions(), installed()
    connection = connections["pg"]
    with transaction.atomic(using="pg"), connection.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA {SCRATCH}")
        cursor.execute(f"SET LOCAL search_path TO {SCRATCH}")
        for name, (statement, _) in table.items():
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


@on_pg
def test_the_files_tables_sequence_and_trigger_exist() -> None:
    require_pg()
    with connections["pg"].cursor() as cursor:
        cursor.execute(
            "SELECT to_regclass('django_distlock_epoch'), to_regclass('django_distlock_fencing'),"
            " to_regclass('django_distlock_share_waiter'),"
            " to_regclass('distlock_held_c_idx'), to_regclass('distlock_name_c_idx')"
        )
        assert all(cursor.fetchone()), "a relation of the file is missing"
        cursor.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgname = 'django_distlock_first_token'"
            " AND tgrelid = 'django_distlock_lock'::regclass"
        )
        assert cursor.fetchone()[0] == 1


def test_the_migration_imports_nothing_of_the_package() -> None:
    """A migration runs on every database for ever: it reads the file by its path."""
    from django_distlock.migrations import __file__ as package

    for path in Path(package).parent.glob("0*.py"):
        assert not re.search(r"^\s*(from|import) django_distlock", path.read_text(), re.M), path


@on_pg
def test_the_migration_unapplied_leaves_nothing_and_applies_again() -> None:
    """``migrate django_distlock zero`` drops every routine of the file (whatever its
    signature), its tables and sequence; ``migrate`` installs them again."""
    from django.db.migrations.executor import MigrationExecutor

    require_pg()
    connection = connections["pg"]
    relations = (
        "SELECT to_regclass('django_distlock_epoch'), to_regclass('django_distlock_fencing'),"
        " to_regclass('django_distlock_share_waiter'), to_regclass('django_distlock_lock')"
    )
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '10s'")  # a session holding a table fails the test
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    try:
        executor.migrate([("django_distlock", None)])
        assert installed() == {}
        with connection.cursor() as cursor:
            cursor.execute(relations)
            assert cursor.fetchone() == (None, None, None, None)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaves)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert sorted(installed()) == sorted(definitions())
    with connection.cursor() as cursor:
        cursor.execute(relations)
        assert all(cursor.fetchone())


@on_pg
def test_the_helpers_on_a_grants_path_are_inlined() -> None:
    """``django_distlock_reserved`` (in every share's grant) and
    ``django_distlock_channel`` are SQL functions that the planner inlines, so that they
    cost no call (the file's header): a plan shows their bodies, not their names."""
    require_pg()
    with connections["pg"].cursor() as cursor:
        cursor.execute(
            "EXPLAIN (VERBOSE) SELECT django_distlock_reserved(l.next_owner, l.next_epoch,"
            " l.expires_at, l.next_ttl, clock_timestamp()), django_distlock_channel(l.name)"
            " FROM django_distlock_lock l"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "django_distlock_orphaned(" in plan and "md5(" in plan, plan
    assert "django_distlock_reserved(" not in plan, plan
    assert "django_distlock_channel(" not in plan, plan


@on_pg
def test_the_channel_is_the_one_the_head_listens_on() -> None:
    """The server notifies the channel that ``pg_channel()`` names to the listening head."""
    from django_distlock.backends.database.shares_sql import pg_channel

    require_pg()
    with connections["pg"].cursor() as cursor:
        cursor.execute("SELECT django_distlock_channel(%s)", ["name:é ü"])
        assert cursor.fetchone()[0] == pg_channel("name:é ü")
