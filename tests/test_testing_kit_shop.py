"""The examples of docs/testing.md ("Testing code that takes locks"), run on the shop:
the kit's fixtures on the shop's view, task and services, as a user's tests would be."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from django.test import TransactionTestCase

from django_distlock import locks
from django_distlock.exceptions import BackendUnavailable, LockLost, StaleFencingToken
from django_distlock.testing import LockTestMixin, run_in_processes, stock
from testproject.shop.models import Order, Product
from testproject.shop.services import sell_one, stock_lock_name
from testproject.shop.tasks import sell_one_task

# Other processes must see the test's rows: no test-wide transaction.
pytestmark = pytest.mark.django_db(transaction=True)  # as docs/testing.md shows it
pytestmark = [pytestmark, pytest.mark.django_versions]  # and its tier (CONTRIBUTING.md)


# -- docs: "A lock held by another worker" ---------------------------------------------
def test_buy_answers_423_while_another_worker_holds_the_stock(client, distlock_hold_elsewhere):
    mug = Product.objects.create(name="mug", stock=3)
    with distlock_hold_elsewhere(stock_lock_name(mug.pk)):
        response = client.post(f"/shop/buy/{mug.pk}/")  # waits 2 s, then gives up
    assert response.status_code == 423
    mug.refresh_from_db()
    assert mug.stock == 3
    assert client.post(f"/shop/buy/{mug.pk}/").status_code == 201  # free again


# -- docs: "The lock server is down" -----------------------------------------------------
def test_the_sale_task_sells_nothing_when_the_lock_server_is_down(distlock_backend_unavailable):
    mug = Product.objects.create(name="mug", stock=3)
    with distlock_backend_unavailable("default"), pytest.raises(BackendUnavailable):
        sell_one_task(mug.pk)
    mug.refresh_from_db()
    assert mug.stock == 3 and not Order.objects.exists()
    assert sell_one_task(mug.pk) is not None  # the server is back


# -- docs: "A lock taken away from its holder" ------------------------------------------
def test_a_holder_whose_lock_was_taken_cannot_write_over_the_next_one(
    distlock_make_lost, distlock_hold_elsewhere
):
    mug = Product.objects.create(name="mug", stock=3)
    name = stock_lock_name(mug.pk)
    paused = locks["default"].lock(name)
    assert paused.acquire()
    distlock_make_lost(paused)  # its lease is gone, as after a long GC pause
    with distlock_hold_elsewhere(name) as newer:  # the next worker takes the lock...
        product = Product.objects.get(pk=mug.pk)
        product.stock -= 1
        product.fenced_save(newer.fencing_token, update_fields=["stock"])  # ...and sells
        with pytest.raises(StaleFencingToken):  # the paused worker wakes up: refused
            sell_one(mug.pk, strategy="late", fence=paused)
    with pytest.raises(LockLost):
        paused.release()
    mug.refresh_from_db()
    assert mug.stock == 2 and not Order.objects.filter(strategy="late").exists()


# -- docs: "Many workers, and the history they leave" -----------------------------------
def sell_all(history, product_id: int) -> None:
    """A worker: sell until sold out, each sale under the stock lock, recorded."""
    name = stock_lock_name(product_id)
    while True:
        with history.hold(locks["default"].lock(name, ttl=30, timeout=30)) as lease:
            began = time.monotonic_ns()
            order = sell_one(product_id, strategy="history", fence=lease)
            if order is None:
                return
            left = order.product.stock
            history.write(name, lease.fencing_token, True, {"sold": 1, "left": left}, began=began)


def test_four_workers_never_sell_the_same_unit(distlock_history):
    mug = Product.objects.create(name="mug", stock=20)
    distlock_history.invariant = stock(initial=20, final=0)
    run_in_processes(sell_all, distlock_history, mug.pk, processes=4)
    report = distlock_history.check()  # also checked at the end of the test
    assert report.processes == 4 and report.writes == 20
    assert Order.objects.count() == 20


def test_the_history_catches_workers_that_take_no_lock(distlock_history):
    mug = Product.objects.create(name="mug", stock=20)
    history = distlock_history

    def sell_unlocked(product_id: int) -> None:  # the bug the lock exists to prevent
        while True:
            op = history.invoke(stock_lock_name(product_id))
            history.granted(op)  # record it as if it were locked
            order = sell_one(product_id, strategy="unlocked", work=0.005)
            history.released(op)
            if order is None:
                return

    run_in_processes(sell_unlocked, mug.pk, processes=4)
    report = history.report()
    assert report.overlaps, "four unlocked workers in 5 ms windows must overlap"
    history.check_at_end = False  # bad on purpose


# -- docs: "With manage.py test" ----------------------------------------------------------
class StockLockTests(LockTestMixin, TransactionTestCase):
    def test_busy(self):
        mug = Product.objects.create(name="mug", stock=3)
        with self.hold_elsewhere(stock_lock_name(mug.pk)):
            self.assertEqual(self.client.post(f"/shop/buy/{mug.pk}/").status_code, 423)

    def test_down(self):
        mug = Product.objects.create(name="mug", stock=3)
        with self.backend_unavailable("default"), self.assertRaises(BackendUnavailable):
            sell_one_task(mug.pk)

    def test_history(self):
        mug = Product.objects.create(name="mug", stock=20)
        history = self.lock_history(invariant=stock(initial=20, final=0))
        run_in_processes(sell_all, history, mug.pk, processes=4)
        self.assertHistoryOK(history)


def test_the_docs_show_these_tests_as_they_are() -> None:
    """Every Python example of the docs' shop section is code of this module, verbatim."""
    docs = (Path(__file__).parents[1] / "docs" / "testing.md").read_text()
    section = docs[docs.index("## The shop, tested with the kit") : docs.index("## Histories")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 6
    source = Path(__file__).read_text()
    for block in blocks:
        for line in block.splitlines():
            assert line in source, f"docs/testing.md shows a line the tests do not run: {line!r}"
