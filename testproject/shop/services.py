"""Selling one unit of stock: with no protection, under a lock, optimistically, fenced.

:func:`sell_one` is the critical section: read the stock, check it, decrement
it, record the order. It is a read-modify-write, so two processes running it
at once can both read "1 left" and both sell. :func:`buy_no_lock`,
:func:`buy_with_lock` and :func:`buy_fenced` run it under a strategy;
:func:`buy_optimistic` takes no lock and lets the version column refuse a
stale write instead. Each returns an :class:`Attempt`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F

from django_distlock import locks
from django_distlock.contrib.optimistic import retry_on_conflict
from django_distlock.handle import Lock

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
    product_id: int,
    *,
    strategy: str,
    worker: str = "",
    work: float = 0.0,
    fence: Lock | None = None,
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

    The decrement writes back the value read, as unprotected code does (a
    ``QuerySet.update()``, which the version check does not see, though it
    bumps the version so that optimistic buyers notice), unless ``fence`` is
    given: then it is a fenced write that the database refuses if a newer
    holder of the stock lock has written.

    :param work: seconds of simulated work (payment, fraud checks) between the
        stock check and the decrement; it widens the window of the race.
    :param fence: the held stock lock, to fence the write with its token.
    :raises Product.DoesNotExist: for an unknown product.
    :raises StaleFencingToken: (with ``fence``) the lock was lost and a newer
        holder has written; nothing was sold.
    """
    product = Product.objects.get(pk=product_id)
    if product.stock <= 0:
        return None
    if work > 0:
        time.sleep(work)
    product.stock -= 1
    with transaction.atomic(savepoint=False):
        if fence is None:
            Product.objects.filter(pk=product.pk).update(
                stock=product.stock, version=F("version") + 1
            )
        else:
            product.fenced_save(fence, update_fields=["stock"])
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


def buy_fenced(
    product_id: int, alias: str, *, strategy: str, worker: str = "", work: float = 0.0
) -> Attempt:
    """Like :func:`buy_with_lock`, and the decrement is fenced by the lock's token.

    :raises LockTimeout: when the lock is not had within the alias' ``TIMEOUT``.
    :raises StaleFencingToken: when the lock was lost to a newer holder who wrote first.
    """
    handle = locks[alias].lock(stock_lock_name(product_id))
    started = time.monotonic()
    with handle:
        waited = time.monotonic() - started
        order = sell_one(product_id, strategy=strategy, worker=worker, work=work, fence=handle)
    return Attempt(order is not None, waited)


#: Conflicts an optimistic purchase retries before it gives up (8 buyers on one row
#: conflict often; the backoff spreads them out).
OPTIMISTIC_ATTEMPTS = 100


def buy_optimistic(
    product_id: int,
    *,
    strategy: str = "optimistic",
    worker: str = "",
    work: float = 0.0,
    attempts: int = OPTIMISTIC_ATTEMPTS,
) -> Attempt:
    """Sell one unit with no lock: the version column refuses a stale decrement.

    Read, check, decrement with ``save()`` (one ``UPDATE ... WHERE version =
    <read>``) and record the order in one transaction; on a conflict the
    transaction rolls back and the whole read-check-write is retried with
    backoff, up to ``attempts`` times.

    :raises VersionConflict: after ``attempts`` conflicts in a row.
    """

    @retry_on_conflict(attempts=attempts)
    def attempt() -> Order | None:
        product = Product.objects.get(pk=product_id)
        if product.stock <= 0:
            return None
        if work > 0:
            time.sleep(work)
        with transaction.atomic():
            product.stock -= 1
            product.save(update_fields=["stock"])
            return Order.objects.create(
                product=product, quantity=1, strategy=strategy, worker=worker, pid=os.getpid()
            )

    return Attempt(attempt() is not None)
