"""Lease mode: readers of read-write locks and permits of semaphores, each a row of
``django_distlock_share`` with its own expiry; on the lock's row, a semaphore's stored
limit and a waiting writer's mark (docs/database.md)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0007_fencing_sequence"),
    ]

    operations = [
        migrations.AddField(
            model_name="lockrecord",
            name="intent_owner",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="lockrecord",
            name="intent_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="lockrecord",
            name="share_limit",
            field=models.IntegerField(blank=True, null=True),
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
    ]
