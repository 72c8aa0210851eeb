from django.db import migrations


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("django_distlock", "0001_squashed_0014_share_waiters"),
    ]

    operations = [
        migrations.CreateModel(
            name="HeldLock",
            fields=[],
            options={
                "verbose_name": "held lock",
                "permissions": [
                    ("view_held_lock", "Can see the held locks"),
                    ("force_release_lock", "Can force-release a held lock"),
                ],
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("django_distlock.lockrecord",),
        ),
    ]
