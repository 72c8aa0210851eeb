from django.db import migrations, models
from django.db.models import Q

# On PostgreSQL, listing pages through names in byte order ("C" collation),
# whatever the database's collation, so a prefix is one contiguous range.
PG_INDEXES = (
    'CREATE INDEX IF NOT EXISTS distlock_held_c_idx ON django_distlock_lock '
    '((name COLLATE "C")) WHERE owner IS NOT NULL',
    'CREATE INDEX IF NOT EXISTS distlock_name_c_idx ON django_distlock_lock '
    '((name COLLATE "C"))',
)


def create_pg_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in PG_INDEXES:
            schema_editor.execute(sql)


def drop_pg_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS distlock_held_c_idx")
        schema_editor.execute("DROP INDEX IF EXISTS distlock_name_c_idx")


class Migration(migrations.Migration):
    initial = True
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
            ],
            options={
                "db_table": "django_distlock_lock",
                "verbose_name": "lock record",
                "indexes": [
                    models.Index(
                        condition=Q(owner__isnull=False), fields=["name"], name="distlock_held_idx"
                    )
                ],
            },
        ),
        migrations.RunPython(create_pg_indexes, drop_pg_indexes, elidable=False),
    ]
