"""Models for the optimistic-locking tests."""

import uuid

from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.db import models

from django_distlock.contrib.optimistic import OptimisticLockMixin, VersionField

__all__ = [
    "Account",
    "Item",
    "ItemProxy",
    "Kiosk",
    "KioskProxy",
    "Place",
    "PlainItem",
    "PlainPlace",
    "PlainShop",
    "PlainSite",
    "RevisedItem",
    "Shelf",
    "Shop",
    "Stall",
    "StampedItem",
    "Tagged",
    "UuidKiosk",
    "UuidSite",
]


class Shelf(models.Model):
    """A plain model the items may point to."""

    label = models.CharField(max_length=20, default="")


class Item(OptimisticLockMixin, models.Model):
    """A stock-keeping item with the inherited ``version`` column."""

    name = models.CharField(max_length=50, default="")
    stock = models.IntegerField(default=0)  # not Positive: a test must be able to see < 0
    note = models.CharField(max_length=50, default="")
    shelf = models.ForeignKey(Shelf, null=True, blank=True, on_delete=models.SET_NULL)


class ItemProxy(Item):
    class Meta:
        proxy = True


class PlainItem(models.Model):
    """Item's twin without the mixin, for the query-count comparison."""

    name = models.CharField(max_length=50, default="")
    stock = models.IntegerField(default=0)
    note = models.CharField(max_length=50, default="")
    shelf = models.ForeignKey(Shelf, null=True, blank=True, on_delete=models.SET_NULL)


class RevisedItem(OptimisticLockMixin, models.Model):
    """The version column renamed: the inherited field dropped, another declared."""

    version = None  # type: ignore[assignment]
    revision = VersionField()
    name = models.CharField(max_length=50, default="")


class StampedItem(OptimisticLockMixin, models.Model):
    """An ``auto_now`` field, which a checked save must still stamp."""

    name = models.CharField(max_length=50, default="")
    touched = models.DateTimeField(auto_now=True)


class Place(OptimisticLockMixin, models.Model):
    """Parent of a multi-table-inheritance pair; the version lives in this table."""

    name = models.CharField(max_length=50, default="")


class Shop(Place):
    """Child: its saves bump the parent's version, then save both tables."""

    stock = models.IntegerField(default=0)


class PlainPlace(models.Model):
    name = models.CharField(max_length=50, default="")


class PlainShop(PlainPlace):
    stock = models.IntegerField(default=0)


class PlainSite(models.Model):
    """A plain parent whose child holds the version column in its own table."""

    name = models.CharField(max_length=50, default="")


class Kiosk(OptimisticLockMixin, PlainSite):
    """The version in the child's table: its key is the parent link, which Django
    sets from the parent row it has just inserted."""

    stock = models.IntegerField(default=0)


class KioskProxy(Kiosk):
    class Meta:
        proxy = True


class Stall(Kiosk):
    """A grandchild: the version lives in its parent's table, keyed by that parent's link."""

    slot = models.IntegerField(default=0)


class UuidSite(models.Model):
    """A plain parent whose key comes from a default: a key given by the caller's side."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    name = models.CharField(max_length=50, default="")


class UuidKiosk(OptimisticLockMixin, UuidSite):
    stock = models.IntegerField(default=0)


class Tagged(OptimisticLockMixin, models.Model):
    """A generic foreign key (a private field), which a checked save must check too."""

    # No constraint: this unmigrated app's tables are made before contenttypes' migration runs.
    content_type = models.ForeignKey(
        ContentType, null=True, on_delete=models.CASCADE, db_constraint=False
    )
    object_id = models.PositiveBigIntegerField(null=True)
    target = GenericForeignKey("content_type", "object_id")


class Account(OptimisticLockMixin, models.Model):
    """Nullable fields of each kind whose NULL the admin's signed read must keep apart
    from the text "None" and from "" (issue 20, item 17)."""

    username = models.CharField(max_length=30, null=True, blank=True)
    count = models.IntegerField(default=0)
    limit = models.IntegerField(null=True, blank=True)
    amount = models.DecimalField(max_digits=8, decimal_places=2, null=True, blank=True)
    ratio = models.FloatField(null=True, blank=True)
    ref = models.UUIDField(null=True, blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)
    shelf = models.ForeignKey(Shelf, null=True, blank=True, on_delete=models.SET_NULL)

    def __str__(self) -> str:
        return f"account {self.pk}"
