"""Selling one unit of stock, with and without a distributed lock.

:func:`sell_one` is the critical section: read the stock, check it, decrement
it, record the order. It is a read-modify-write, so two processes running it
at once can both read "1 left" and both sell. :func:`buy_no_lock` and
:func:`buy_with_lock` run it under a strategy and return an :class:`Attempt`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from django.db import transaction

from django_distlock import locks

from .models import Order, Product


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of one purchase attempt."""

    #: Whether a unit was sold (False: sold out).
    bought: bool
    #: Seconds spent acquiring the lock; None when no lock was taken.
    lock_wait: float | None = None


def stock_lock_name(product_id: int) -> str:
    """The name of the lock that guards a product's stock."""
    return f"stock:{product_id}"


def sell_one(
    product_id: int, *, strategy: str, worker: str = "", work: float = 0.0
) -> Order | None:
    """Sell one unit and return its order, or None when sold out.

    The decrement and the order commit together, in one transaction; the
    read and check before them are not in it. That is deliberate: a
    transaction alone does not stop two processes from reading the same
    stock (READ COMMITTED on PostgreSQL), so excluding them is the lock's
    job, and the flash sale shows whether it does it. (On SQLite an
    ``IMMEDIATE`` transaction around the read would itself serialise every
    writer, whatever the lock.) Inside a transaction-mode lock the block
    joins the lock's transaction, without a savepoint.

    :param work: seconds of simulated work (payment, fraud checks) between the
        stock check and the decrement; it widens the window of the race.
    :raises Product.DoesNotExist: for an unknown product.
    """
    product = Product.objects.get(pk=product_id)
    if product.stock <= 0:
        return None
    if work > 0:
        time.sleep(work)
    with transaction.atomic(savepoint=False):
        product.stock -= 1
        product.save(update_fields=["stock"])
        return Order.objects.create(
            product=product, quantity=1, strategy=strategy, worker=worker, pid=os.getpid()
        )


def buy_no_lock(
    product_id: int, *, strategy: str = "no lock", worker: str = "", work: float = 0.0
) -> Attempt:
    """Sell one unit with no lock: the naive code the locks exist to fix."""
    order = sell_one(product_id, strategy=strategy, worker=worker, work=work)
    return Attempt(order is not None)


def buy_with_lock(
    product_id: int, alias: str, *, strategy: str, worker: str = "", work: float = 0.0
) -> Attempt:
    """Sell one unit holding the stock lock of the ``DISTLOCK`` alias ``alias``.

    Under a lease (database lease mode, a lock server) the sale commits in
    its own transaction before the release. Under a database
    transaction-mode lock the sale joins the lock's transaction, which
    commits on release (or rolls back on an exception) and frees the lock
    with it.

    :raises LockTimeout: when the lock is not had within the alias' ``TIMEOUT``.
    """
    handle = locks[alias].lock(stock_lock_name(product_id))
    started = time.monotonic()
    with handle:
        waited = time.monotonic() - started
        order = sell_one(product_id, strategy=strategy, worker=worker, work=work)
    return Attempt(order is not None, waited)
