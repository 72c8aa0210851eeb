"""PostgreSQL: transaction-mode fencing tokens come from a sequence, whose numbers are
never given twice, even by a grant whose transaction rolled back or whose session died
(docs/database.md). Starts above every token issued so far."""

from django.db import migrations

CREATE = (
    "CREATE SEQUENCE IF NOT EXISTS django_distlock_fencing AS bigint;"
    " SELECT setval('django_distlock_fencing',"
    " GREATEST(1, (SELECT coalesce(max(fencing), 0) FROM django_distlock_lock)), true);"
)
DROP = "DROP SEQUENCE IF EXISTS django_distlock_fencing;"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("django_distlock", "0006_lock_event_context")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
