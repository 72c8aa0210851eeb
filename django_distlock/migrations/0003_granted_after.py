"""PostgreSQL: the wait procedure reports how long the server waited before granting;
the release no longer notifies (sql/0003_granted_after.sql)."""

from pathlib import Path

from django.db import migrations

SQL = Path(__file__).with_name("sql") / "0003_granted_after.sql"
PREVIOUS = Path(__file__).with_name("sql") / "0002_lease_handoff.sql"


def _run(path):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(path.read_text(), params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("django_distlock", "0002_lease_handoff")]

    operations = [migrations.RunPython(_run(SQL), _run(PREVIOUS), elidable=False)]
