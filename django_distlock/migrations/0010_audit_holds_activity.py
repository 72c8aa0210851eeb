"""One audit row per hold (``LockEvent.acquired_at``, kind ``purged``) and the activity
page's pre-aggregated buckets (``LockActivity``), filled from the last 7 days of the
trail so that the page shows the activity recorded before the upgrade."""

from datetime import timedelta
from typing import Any

from django.db import migrations, models
from django.utils import timezone

#: Events read per query while filling the buckets.
BATCH = 20_000


def fill_buckets(apps: Any, schema_editor: Any) -> None:
    """Count the last 7 days of the trail into the buckets (rows written before this
    migration: an ``acquired`` row counts the acquisition, a ``released`` one its hold)."""
    from django_distlock.audit import buckets

    event = apps.get_model("django_distlock", "LockEvent")
    activity = apps.get_model("django_distlock", "LockActivity")
    database = schema_editor.connection.alias
    since = timezone.now() - timedelta(days=7)
    fields = ("id", "at", "kind", "alias", "name", "waited", "held", "acquired_at")
    rows = event.objects.using(database).filter(at__gte=since).order_by("id").values(*fields)
    last = 0
    while True:
        batch = list(rows.filter(id__gt=last)[:BATCH])
        if not batch:
            return
        buckets.store(buckets.collect(batch), using=database, model=activity)
        last = batch[-1]["id"]


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0009_share_routines"),
    ]

    operations = [
        migrations.AddField(
            model_name="lockevent",
            name="acquired_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="lockevent",
            name="kind",
            field=models.CharField(
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
                        fields=("span", "start", "alias", "prefix"),
                        name="distlock_activity_uniq",
                    )
                ],
            },
        ),
        migrations.RunPython(fill_buckets, migrations.RunPython.noop, elidable=True),
    ]
