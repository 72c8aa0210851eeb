"""Three products alike but for their optimistic locking, and the orders of a flash sale.

``PlainProduct`` has no version; ``OptimisticProduct`` uses django-distlock's
``OptimisticLockMixin``; ``ConcurrencyProduct`` uses django-concurrency's
``AutoIncVersionField`` (+1 per save, as django-distlock's ``VersionField``).
``ConcurrencyProduct`` exists only when django-concurrency is installed
(``pip install -e '.[dev]'``); ``benchmarks.orm.setup()`` says so when it is not.
"""

from __future__ import annotations

import importlib.util

from django.db import models

from django_distlock.contrib.optimistic import OptimisticLockMixin

__all__ = ["HAS_CONCURRENCY", "OptimisticProduct", "PlainProduct", "SaleOrder"]

HAS_CONCURRENCY = importlib.util.find_spec("concurrency") is not None


class ProductFields(models.Model):
    """What every product has besides its locking."""

    name = models.CharField(max_length=100)
    price = models.DecimalField(max_digits=10, decimal_places=2, default=0)
    # A plain IntegerField, not Positive...: an oversell must show as a negative
    # stock, not be refused by a CHECK constraint the benchmark would not count.
    stock = models.IntegerField(default=0)

    class Meta:
        abstract = True


class PlainProduct(ProductFields):
    """No version column: ``save()`` is Django's."""


class OptimisticProduct(OptimisticLockMixin, ProductFields):
    """django-distlock's optimistic locking (inherits ``version = VersionField()``)."""


class SaleOrder(models.Model):
    """One unit sold in a flash sale, by one worker process."""

    product = models.ForeignKey(OptimisticProduct, on_delete=models.CASCADE)
    worker = models.SmallIntegerField()


if HAS_CONCURRENCY:
    from concurrency.fields import AutoIncVersionField

    class ConcurrencyProduct(ProductFields):
        """django-concurrency's optimistic locking (it wraps the model's ``_do_update``)."""

        version = AutoIncVersionField()

    __all__ += ["ConcurrencyProduct"]
