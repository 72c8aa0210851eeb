"""PostgreSQL: a lock row made anew after a prune starts above every pruned row's
fencing token, and the wait procedure returns that token on a name's first grant
(sql/0011_prune_high_water.sql); SQLite does the same in its statements."""

from pathlib import Path

from django.db import migrations

SQL = Path(__file__).with_name("sql")
DROP = (
    "DROP TRIGGER IF EXISTS django_distlock_first_token ON django_distlock_lock;"
    " DROP FUNCTION IF EXISTS django_distlock_first_token();"
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute((SQL / "0011_prune_high_water.sql").read_text(), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)
        # The wait procedure as 0009 left it (the file's other routines are unchanged).
        schema_editor.execute((SQL / "0009_share_routines.sql").read_text(), params=None)


class Migration(migrations.Migration):
    # 0010 is taken by another branch; the lead may point this at it when both merge.
    dependencies = [("django_distlock", "0010_audit_holds_activity")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
