from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []  # type: ignore[misc]

    operations = [
        migrations.CreateModel(
            name="LockActivity",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("span", models.IntegerField()),
                ("start", models.DateTimeField()),
                ("alias", models.CharField(max_length=100)),
                ("prefix", models.CharField(max_length=255)),
                ("acquired", models.BigIntegerField(default=0)),
                ("failed", models.BigIntegerField(default=0)),
                ("lost", models.BigIntegerField(default=0)),
                ("forced", models.BigIntegerField(default=0)),
                ("waits", models.JSONField(default=dict)),
                ("holds", models.JSONField(default=dict)),
            ],
            options={
                "verbose_name": "lock activity bucket",
                "db_table": "django_distlock_activity",
                "default_permissions": (),
                "constraints": [
                    models.UniqueConstraint(
                        fields=("span", "start", "alias", "prefix"), name="distlock_activity_uniq"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="LockEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("at", models.DateTimeField(db_index=True)),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("acquired", "acquired (still held)"),
                            ("released", "held and released"),
                            ("lost", "held, then expired or lost"),
                            ("failed", "failed to acquire"),
                            ("force_released", "force-released"),
                            ("purged", "audit trail purged"),
                        ],
                        max_length=20,
                    ),
                ),
                ("acquired_at", models.DateTimeField(blank=True, null=True)),
                ("alias", models.CharField(max_length=100)),
                ("name", models.CharField(max_length=255)),
                ("fencing_token", models.BigIntegerField(blank=True, null=True)),
                ("owner", models.CharField(blank=True, default="", max_length=16)),
                ("host", models.CharField(blank=True, default="", max_length=255)),
                ("pid", models.IntegerField(blank=True, null=True)),
                ("thread", models.CharField(blank=True, default="", max_length=255)),
                ("context", models.CharField(blank=True, default="", max_length=255)),
                ("waited", models.FloatField(blank=True, null=True)),
                ("held", models.FloatField(blank=True, null=True)),
                ("actor", models.CharField(blank=True, default="", max_length=150)),
                ("reason", models.TextField(blank=True, default="")),
            ],
            options={
                "verbose_name": "lock event",
                "db_table": "django_distlock_event",
                "ordering": ["-at", "-id"],
                "indexes": [
                    models.Index(fields=["alias", "name", "at"], name="distlock_event_name_idx")
                ],
            },
        ),
    ]
