"""Lease-mode handoff: the reservation columns, and on PostgreSQL the procedures that
waiting threads queue in and that releases run (sql/0002_lease_handoff.sql; the design
is in docs/database.md)."""

from pathlib import Path

from django.db import migrations, models

SQL = Path(__file__).with_name("sql") / "0002_lease_handoff.sql"

DROP_PROCEDURES = (
    "DROP PROCEDURE IF EXISTS django_distlock_release(text, text, bigint, boolean)",
    "DROP PROCEDURE IF EXISTS django_distlock_wait(text, text, float8, text, integer, text, "
    "float8, boolean, bigint, timestamptz, timestamptz, float8, bigint)",
)


def create_procedures(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SQL.read_text(), params=None)


def drop_procedures(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP_PROCEDURES:
            schema_editor.execute(statement)

class Migration(migrations.Migration):
    dependencies = [("django_distlock", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="lockrecord",
            name="next_owner",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="lockrecord", name="next_ttl", field=models.FloatField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="lockrecord",
            name="next_host",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="lockrecord",
            name="next_pid",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="lockrecord",
            name="next_thread",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.RunPython(create_procedures, drop_procedures, elidable=False),
    ]
