"""The listing by age (backends/database/ordered.py): held longest first and expiring
soonest first, each a range of one of these partial indexes over the held rows."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_distlock", "0012_held_lock_entry"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="lockrecord",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["acquired_at", "name"],
                name="distlock_held_acquired_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="lockrecord",
            index=models.Index(
                condition=models.Q(("owner__isnull", False)),
                fields=["expires_at", "name"],
                name="distlock_held_expires_idx",
            ),
        ),
    ]
