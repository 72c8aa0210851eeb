"""PostgreSQL: lease mode's readers, writers and permits in one call per grant, release,
extend and force release, and the head of a name's queue woken by the release that frees
the name, the exclusive release's included; a lock() waiter behind readers or permits
woken by the last one's release (sql/0009_share_routines.sql)."""

from pathlib import Path

from django.db import migrations

SQL = Path(__file__).with_name("sql")
#: The live definitions before this migration: 0003's release, 0004's wait and others.
PREVIOUS = (SQL / "0003_granted_after.sql", SQL / "0004_orphaned_reservations.sql")
DROP = "DROP PROCEDURE IF EXISTS django_distlock_share_release(text, text, boolean, boolean);"
DROP += " ".join(
    f"DROP FUNCTION IF EXISTS django_distlock_share_{signature};"
    for signature in (
        "grant(text, text, text, float8, integer, text, integer, text, boolean, boolean, "
        "boolean)",
        "extend(text, text, float8)",
        "force(text, text)",
        "join(text, float8)",
        "leave(text, boolean, text)",
        "recompute(text, timestamptz)",
        "wake(text)",
    )
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute((SQL / "0009_share_routines.sql").read_text(), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for path in PREVIOUS:
            schema_editor.execute(path.read_text(), params=None)
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("django_distlock", "0008_shares")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
