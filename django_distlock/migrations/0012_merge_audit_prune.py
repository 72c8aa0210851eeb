"""Joins the two migrations made beside each other on 0009: the audit trail's holds and
buckets (0010) and the pruning high-water row (0011). Nothing to do of its own."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0010_audit_holds_activity"),
        ("django_distlock", "0011_prune_high_water"),
    ]

    operations = []
