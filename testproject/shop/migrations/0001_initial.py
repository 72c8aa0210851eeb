import django.db.models.deletion
from django.db import migrations, models

import django_distlock.contrib.optimistic
import django_distlock.contrib.optimistic.fencing


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Product",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("version", django_distlock.contrib.optimistic.VersionField()),
                ("fencing_token", django_distlock.contrib.optimistic.fencing.FencingTokenField()),
                ("name", models.CharField(max_length=200, unique=True)),
                ("price", models.DecimalField(decimal_places=2, default=0, max_digits=10)),
                ("stock", models.IntegerField(default=0)),
            ],
            options={
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="Order",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("quantity", models.PositiveIntegerField(default=1)),
                ("strategy", models.CharField(db_index=True, max_length=100)),
                ("worker", models.CharField(blank=True, default="", max_length=100)),
                ("pid", models.PositiveIntegerField(blank=True, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                (
                    "product",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="orders",
                        to="shop.product",
                    ),
                ),
            ],
        ),
    ]
