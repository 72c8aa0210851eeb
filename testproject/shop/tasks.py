"""Background tasks of the shop: plain functions, and Celery tasks when Celery is installed.

The lock decorator works the same on a task as on a view: the stock lock is
taken around the whole task body, on whichever worker machine runs it. With
Celery, ``@shared_task`` goes above ``@distlock`` (``@distlock`` on a task object
raises TypeError: docs/tasks.md).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import DatabaseError

from django_distlock import distlock
from django_distlock.exceptions import DistLockError, LockNotAcquired

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


def flashsale_buy(label: str, alias: str | None, kind: str, product_id: int,
                  work: float) -> dict[str, Any]:
    """One flash-sale purchase attempt with a strategy (``manage.py flashsale --via
    celery``); what happened, for the sale's table.

    :returns: ``{"pid", "outcome", "lock_wait", "error"}``; the outcome is one of the
        flash sale's (bought, sold out, lock timeout, error).
    """
    from .flashsale.strategies import Strategy
    from .flashsale.worker import BOUGHT, ERROR, LOCK_TIMEOUT, SOLD_OUT

    strategy = Strategy(label, alias, None, kind)
    outcome, lock_wait, error = ERROR, None, None
    started = time.monotonic()
    try:
        attempt = strategy.buy(product_id, worker=f"celery-{os.getpid()}", work=work)
    except LockNotAcquired as exc:
        outcome, error = LOCK_TIMEOUT, f"{type(exc).__name__}: {exc}"
    except (DatabaseError, DistLockError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    else:
        outcome, lock_wait = (BOUGHT if attempt.bought else SOLD_OUT), attempt.lock_wait
    return {"pid": os.getpid(), "outcome": outcome, "lock_wait": lock_wait, "error": error,
            "started": started, "finished": time.monotonic()}


try:
    from celery import shared_task
except ImportError:  # Celery is optional: the plain functions above are the tasks
    pass
else:
    #: ``sell_one_task`` as a Celery task (``.delay(product_id)``).
    celery_sell_one = shared_task(name="shop.sell_one")(sell_one_task)
    #: ``flashsale_buy`` as a Celery task.
    celery_flashsale_buy = shared_task(name="shop.flashsale_buy")(flashsale_buy)
