"""Products with stock, and the orders that sold them."""

from __future__ import annotations

from django.db import models

from django_distlock.contrib.optimistic import OptimisticLockMixin
from django_distlock.contrib.optimistic.fencing import FencedModelMixin


class Product(OptimisticLockMixin, FencedModelMixin, models.Model):
    """Something for sale, with the units left.

    ``stock`` is a plain integer, not a ``PositiveIntegerField``: the flash
    sale must be able to record a race that drives it below zero rather than
    have a CHECK constraint hide it.

    ``version`` (optimistic locking: ``save()`` refuses a stale write) and
    ``fencing_token`` (``fenced_save()`` refuses a write under a stale lock)
    come from the mixins.
    """

    name = models.CharField(max_length=200, unique=True)
    price = models.DecimalField(max_digits=10, decimal_places=2, default=0)
    stock = models.IntegerField(default=0)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Order(models.Model):
    """One sale of ``quantity`` units of a product, by one worker process."""

    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="orders")
    quantity = models.PositiveIntegerField(default=1)
    #: Which strategy sold it: "no lock", "database lease (default)", "view", ...
    strategy = models.CharField(max_length=100, db_index=True)
    #: The worker that sold it (flash-sale worker name, or host for the view).
    worker = models.CharField(max_length=100, blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"Order {self.pk}: {self.quantity} x {self.product_id} ({self.strategy})"
