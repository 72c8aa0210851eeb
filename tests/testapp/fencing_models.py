"""Models for the fenced-write tests."""

from django.db import models

from django_distlock.contrib.optimistic import OptimisticLockMixin
from django_distlock.contrib.optimistic.fencing import (
    FencedManager,
    FencedModelMixin,
    FencingTokenField,
)

__all__ = [
    "Depot",
    "DoublyFenced",
    "FencedDepot",
    "FencedItem",
    "FencedItemProxy",
    "FencedPlace",
    "FencedShop",
    "RenamedFenceItem",
    "VersionedFencedItem",
    "VersionedFencedShop",
]


class FencedItem(FencedModelMixin):
    """A fenced row: a label, a stock count and a timestamp ``save()`` refreshes."""

    label = models.CharField(max_length=50, default="")
    stock = models.IntegerField(default=0)
    touched = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "testapp"


class FencedItemProxy(FencedItem):
    """A proxy: signals are sent with the proxy as sender."""

    class Meta:
        proxy = True
        app_label = "testapp"


class RenamedFenceItem(FencedModelMixin):
    """The token column renamed the way any inherited field is overridden."""

    fencing_token = None  # type: ignore[assignment]
    lease_token = FencingTokenField()
    label = models.CharField(max_length=50, default="")

    class Meta:
        app_label = "testapp"


class DoublyFenced(models.Model):
    """Misconfigured on purpose (two token fields); no table."""

    first_token = FencingTokenField()
    second_token = FencingTokenField()

    class Meta:
        app_label = "testapp"
        managed = False


class VersionedFencedItem(OptimisticLockMixin, FencedModelMixin):
    """Both protections on one row (like the shop's Product)."""

    stock = models.IntegerField(default=0)

    class Meta:
        app_label = "testapp"


class FencedPlace(FencedModelMixin):
    """Parent of a multi-table pair; the token lives in this (the parent's) table."""

    label = models.CharField(max_length=50, default="")

    class Meta:
        app_label = "testapp"


class FencedShop(FencedPlace):
    """Child: a fenced write spans both tables."""

    stock = models.IntegerField(default=0)

    class Meta:
        app_label = "testapp"


class Depot(models.Model):
    """A plain parent, for a child that holds the token itself."""

    label = models.CharField(max_length=50, default="")

    class Meta:
        app_label = "testapp"


class FencedDepot(Depot, FencedModelMixin):
    """Child holding the token in its own table (its parent is a plain model)."""

    stock = models.IntegerField(default=0)

    objects = FencedManager()  # the parent's plain manager would come first

    class Meta:
        app_label = "testapp"


class VersionedFencedShop(OptimisticLockMixin, FencedPlace):
    """The token in the parent's table, the version in the child's."""

    stock = models.IntegerField(default=0)

    class Meta:
        app_label = "testapp"
