"""PostgreSQL: a reservation whose head's session is gone is not honoured unless the
server crashed since it was made; a wait that timed out unlocks only what it holds
(sql/0004_orphaned_reservations.sql)."""

from pathlib import Path

from django.db import migrations, models

SQL = Path(__file__).with_name("sql") / "0004_orphaned_reservations.sql"
PREVIOUS = Path(__file__).with_name("sql") / "0003_granted_after.sql"
DROP = (
    "DROP FUNCTION IF EXISTS django_distlock_orphaned(text, bigint);"
    " DROP FUNCTION IF EXISTS django_distlock_unlock_if_held(bigint);"
    " DROP FUNCTION IF EXISTS django_distlock_epoch();"
    " DROP TABLE IF EXISTS django_distlock_epoch;"
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SQL.read_text(), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PREVIOUS.read_text(), params=None)
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("django_distlock", "0003_granted_after")]

    operations = [
        migrations.AddField(
            model_name="lockrecord",
            name="next_epoch",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
