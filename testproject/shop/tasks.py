"""Background tasks of the shop: plain functions, and Celery tasks when Celery is installed.

The lock decorator works the same on a task as on a view: the stock lock is
taken around the whole task body, on whichever worker machine runs it.
"""

from __future__ import annotations

from django_distlock import distlock

from . import services


@distlock("stock:{product_id}", timeout=5)
def sell_one_task(product_id: int, worker: str = "task") -> int | None:
    """Sell one unit under the stock lock; return the order's id, or None when sold out.

    :raises LockTimeout: when the stock lock is not had within 5 s (a task
        queue would retry the task).
    :raises Product.DoesNotExist: for an unknown product.
    """
    order = services.sell_one(product_id, strategy="task", worker=worker)
    return order.pk if order is not None else None


try:
    from celery import shared_task
except ImportError:  # Celery is optional: the plain function above is the task
    pass
else:
    #: ``sell_one_task`` as a Celery task (``.delay(product_id)``).
    celery_sell_one = shared_task(name="shop.sell_one")(sell_one_task)
