"""The lock tables, and on PostgreSQL the routines, sequence and tables of
``django_distlock/sql/postgresql.sql``; on MySQL and MariaDB the collation, table and
procedures of ``django_distlock/sql/mysql.sql``.

It replaces the 14 migrations of the development versions before 0.1.0: a database that
applied all of them is marked as having applied this one and nothing runs (see
CHANGELOG.md, 0.1.0, for a database that applied only some). It imports nothing of
``django_distlock``: it reads the SQL file by its path.
"""

from pathlib import Path

from django.db import migrations, models

SQL = Path(__file__).resolve().parent.parent / "sql" / "postgresql.sql"
MYSQL_SQL = SQL.with_name("mysql.sql")
#: The sql_mode the MySQL routines are created under (each keeps its own).
MYSQL_MODE = "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'"
MYSQL_UNINSTALL = [
    *(f"DROP PROCEDURE IF EXISTS django_distlock_{name}" for name in (
        "tx_grant", "recompute", "take", "acquire", "wait", "release", "extend", "force",
        "prune", "session_open", "session_take", "session_force")),
    "DROP TABLE IF EXISTS django_distlock_token, django_distlock_waiter,"
    " django_distlock_session_grant, django_distlock_session_epoch,"
    " django_distlock_session_start",
]

#: The indexes of held rows (the listings by name and by age), partial, on PostgreSQL and
#: SQLite (the model cannot declare them: Django warns, models.W037, on MySQL, which has
#: no partial indexes; MySQL's are on generated columns, made by its file).
HELD_INDEXES = [
    "CREATE INDEX IF NOT EXISTS distlock_held_idx ON django_distlock_lock (name)"
    " WHERE owner IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS distlock_held_acquired_idx ON django_distlock_lock"
    " (acquired_at, name) WHERE owner IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS distlock_held_expires_idx ON django_distlock_lock"
    " (expires_at, name) WHERE owner IS NOT NULL",
]

#: Drops every routine of the file (whatever its signature), then its tables and sequence.
UNINSTALL = r"""
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS sig, p.prokind FROM pg_proc p
             WHERE p.proname LIKE 'django\_distlock\_%'
    LOOP
        EXECUTE format('DROP %s %s CASCADE',
                       CASE r.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, r.sig);
    END LOOP;
END
$$;
DROP TABLE IF EXISTS django_distlock_epoch, django_distlock_share_waiter, django_distlock_session;
DROP SEQUENCE IF EXISTS django_distlock_fencing;
"""


def mysql_parts(mariadb: bool) -> list[str]:
    """The statements of ``sql/mysql.sql``, with the server's binary collation."""
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    text = MYSQL_SQL.read_text().replace("{bin}", collation)
    parts = (part.strip() for part in text.split("\n-- ;;\n"))
    return [part for part in parts if not _comment_only(part)]


def _comment_only(part: str) -> bool:
    """Whether ``part`` has no statement (blank, or comments only)."""
    return all(line.startswith("--") or not line.strip() for line in part.splitlines())


def install(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor in ("sqlite", "postgresql"):
        for statement in HELD_INDEXES:
            schema_editor.execute(statement, params=None)
    if connection.vendor == "postgresql":
        schema_editor.execute(SQL.read_text(), params=None)
    elif connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@SESSION.sql_mode")
            (mode,) = cursor.fetchone()
            cursor.execute(MYSQL_MODE)
            try:
                for part in mysql_parts(connection.mysql_is_mariadb):
                    cursor.execute(part)
            finally:
                cursor.execute("SET SESSION sql_mode = %s", [mode])


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(UNINSTALL, params=None)
    elif schema_editor.connection.vendor == "mysql":
        # Through a cursor, as install(): Django runs this in an atomic block on MySQL
        # (its DDL cannot be rolled back), where schema_editor.execute() refuses DDL.
        with schema_editor.connection.cursor() as cursor:
            for statement in MYSQL_UNINSTALL:
                cursor.execute(statement)


class Migration(migrations.Migration):
    initial = True

    replaces = [
        ("django_distlock", "0001_initial"),
        ("django_distlock", "0002_lease_handoff"),
        ("django_distlock", "0003_granted_after"),
        ("django_distlock", "0004_orphaned_reservations"),
        ("django_distlock", "0005_lock_event"),
        ("django_distlock", "0006_lock_event_context"),
        ("django_distlock", "0007_fencing_sequence"),
        ("django_distlock", "0008_shares"),
        ("django_distlock", "0009_share_routines"),
        ("django_distlock", "0010_audit_holds_activity"),
        ("django_distlock", "0011_prune_high_water"),
        ("django_distlock", "0012_held_lock_entry"),
        ("django_distlock", "0013_held_age_indexes"),
        ("django_distlock", "0014_share_waiters"),
    ]

    dependencies: list[tuple[str, str]] = []  # type: ignore[misc]

    operations = [
        migrations.CreateModel(
            name="LockRecord",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("owner", models.CharField(blank=True, max_length=64, null=True)),
                ("fencing", models.BigIntegerField(default=0)),
                ("acquired_at", models.DateTimeField(blank=True, null=True)),
                ("expires_at", models.DateTimeField(blank=True, null=True)),
                ("host", models.CharField(blank=True, default="", max_length=255)),
                ("pid", models.IntegerField(blank=True, null=True)),
                ("thread", models.CharField(blank=True, default="", max_length=255)),
                ("next_owner", models.CharField(blank=True, max_length=64, null=True)),
                ("next_ttl", models.FloatField(blank=True, null=True)),
                ("next_host", models.CharField(blank=True, max_length=255, null=True)),
                ("next_pid", models.IntegerField(blank=True, null=True)),
                ("next_thread", models.CharField(blank=True, max_length=255, null=True)),
                ("next_epoch", models.BigIntegerField(blank=True, null=True)),
                ("share_limit", models.IntegerField(blank=True, null=True)),
                ("intent_owner", models.CharField(blank=True, max_length=64, null=True)),
                ("intent_until", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "lock record",
                "db_table": "django_distlock_lock",
            },
        ),
        migrations.CreateModel(
            name="LockShare",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=255)),
                ("owner", models.CharField(max_length=64)),
                ("kind", models.CharField(max_length=16)),
                ("fencing", models.BigIntegerField()),
                ("acquired_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
                ("host", models.CharField(blank=True, default="", max_length=255)),
                ("pid", models.IntegerField(blank=True, null=True)),
                ("thread", models.CharField(blank=True, default="", max_length=255)),
            ],
            options={
                "verbose_name": "lock share",
                "db_table": "django_distlock_share",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("name", "owner"), name="distlock_share_owner_uniq"
                    )
                ],
            },
        ),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
