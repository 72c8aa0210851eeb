"""The testproject shop: buying through every strategy, with real processes, and its views.

The shop's services write through the default database (SQLite in the
suite); the flash-sale tests run the same services on PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from django_distlock import locks
from django_distlock.exceptions import VersionConflict
from testproject.shop import services, tasks
from testproject.shop.models import Order, Product

from .conftest import DATABASES, in_thread
from .histories import run_forked

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]
STOCK = 12
WORKERS = 4


def _optimistic(pk: int) -> bool:
    return services.buy_optimistic(pk, worker="t", work=0.001).bought


def _lease(pk: int) -> bool:
    return services.buy_with_lock(pk, "default", strategy="lease", work=0.001).bought


def _fenced(pk: int) -> bool:
    return services.buy_fenced(pk, "default", strategy="fenced", work=0.001).bought


def _task(pk: int) -> bool:
    return tasks.sell_one_task(pk) is not None


def _no_lock(pk: int) -> bool:
    return services.buy_no_lock(pk, work=0.005).bought


BUYERS: dict[str, Callable[[int], bool]] = {
    "optimistic": _optimistic,
    "database lock": _lease,
    "fenced": _fenced,
    "task": _task,
}


def _buyer(kind: str, pk: int, start: Any, out: Any) -> None:
    bought = 0
    try:
        start.wait(30)
        buy = BUYERS.get(kind, _no_lock)
        while buy(pk):
            bought += 1
        out.put(("ok", bought))
    except BaseException as exc:  # report, never hang the parent
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        locks.close_all()
        connections.close_all()


def _sale(kind: str, workers: int = WORKERS, stock: int = STOCK) -> tuple[Product, list[int]]:
    """Run ``workers`` processes buying one product until sold out; return it and their counts."""
    product = Product.objects.create(name=f"{kind} sale", stock=stock)
    results, _ = run_forked(_buyer, (kind, product.pk), workers)
    errors = [detail for status, detail in results if status != "ok"]
    assert not errors, errors
    product.refresh_from_db()
    return product, [count for _, count in results]


@pytest.mark.parametrize("kind", sorted(BUYERS))
def test_every_strategy_sells_exactly_the_stock_across_processes(kind: str) -> None:
    product, counts = _sale(kind)
    orders = Order.objects.filter(product=product).count()
    assert product.stock == 0  # never below zero
    assert sum(counts) == orders == STOCK  # units sold + stock left == initial stock


def test_the_control_without_a_lock_oversells() -> None:
    """The check above can fail: unprotected buyers sell more than the stock."""
    product, counts = _sale("no lock", workers=6, stock=6)
    assert sum(counts) > 6
    assert Order.objects.filter(product=product).count() > 6


def test_an_optimistic_buyer_gives_up_after_its_attempts(monkeypatch) -> None:
    product = Product.objects.create(name="contended", stock=3)
    original_save = Product.save

    def another_writer_first(self: Product, *args: Any, **kwargs: Any) -> None:
        Product.objects.filter(pk=self.pk).update(version=self.version + 1)  # a real write
        original_save(self, *args, **kwargs)

    monkeypatch.setattr(Product, "save", another_writer_first)
    with pytest.raises(VersionConflict):
        services.buy_optimistic(product.pk, attempts=3)
    monkeypatch.undo()
    product.refresh_from_db()
    assert product.stock == 3
    assert not Order.objects.filter(product=product).exists()  # rolled back with the conflict


def test_the_buy_view_sells_answers_sold_out_and_busy() -> None:
    product = Product.objects.create(name="view", stock=1)
    client = Client()
    url = f"/shop/buy/{product.pk}/"
    first = client.post(url)
    assert first.status_code == 201, first.content
    assert first.json()["stock"] == 0
    assert client.post(url).status_code == 409  # sold out
    assert client.post("/shop/buy/999999/").status_code == 404
    assert client.get(url).status_code == 405
    holder = locks["default"].lock(services.stock_lock_name(product.pk), ttl=30)
    assert in_thread(holder.acquire)  # another worker holds the stock lock
    try:
        busy = client.post(url)  # the view waits 2 s for the stock lock, then answers 423
    finally:
        in_thread(holder.release)
    assert busy.status_code == 423
    assert b"busy" in busy.content


def test_the_product_page_is_served_from_the_cache_and_rebuilt_once() -> None:
    from testproject.shop.views import product_card

    product = Product.objects.create(name="page", price="9.50", stock=4)
    product_card.invalidate(product.pk)  # a pk an earlier test's flushed product had
    client = Client()
    url = f"/shop/product/{product.pk}/"
    first = client.get(url)
    assert first.status_code == 200
    assert first.json() == {"pk": product.pk, "name": "page", "price": "9.50", "stock": 4}
    Product.objects.filter(pk=product.pk).update(stock=3)
    assert client.get(url).json()["stock"] == 4  # the cached card, for up to 5 s
    assert product_card.invalidate(product.pk) is True
    assert client.get(url).json()["stock"] == 3
    assert client.get("/shop/product/999999/").status_code == 404


def test_the_product_page_sells_under_the_stock_lock_and_shows_the_stock_left() -> None:
    product = Product.objects.create(name="html page", price="2.00", stock=1)
    client = Client()
    url = f"/shop/p/{product.pk}/"
    page = client.get(url)
    assert page.status_code == 200 and b"in stock: <span id=\"stock\">1<" in page.content
    sold = client.post(url)
    assert b'id="bought"' in sold.content and b"in stock: <span id=\"stock\">0<" in sold.content
    order = Order.objects.get(product=product)
    assert f"order {order.pk} (stock lock token ".encode() in sold.content
    assert b'id="sold-out"' in client.post(url).content
    holder = locks["default"].lock(services.stock_lock_name(product.pk), ttl=30)
    assert in_thread(holder.acquire)  # another worker holds the stock lock
    try:
        busy = client.post(url)  # waits 2 s for it, then says busy
    finally:
        in_thread(holder.release)
    assert busy.status_code == 200 and b'id="busy"' in busy.content
    assert client.get("/shop/p/999999/").status_code == 404
    assert client.post("/shop/p/999999/").status_code == 404


def test_the_task_waits_for_the_stock_lock() -> None:
    product = Product.objects.create(name="task", stock=1)
    holder = locks["default"].lock(services.stock_lock_name(product.pk), ttl=30)
    held, released = threading.Event(), threading.Event()

    def hold_then_release() -> None:  # another worker holds the lock
        assert holder.acquire()
        held.set()
        time.sleep(0.3)
        released.set()
        holder.release()
        connections.close_all()

    thread = threading.Thread(target=hold_then_release)
    thread.start()
    assert held.wait(10)
    try:
        order_id = tasks.sell_one_task(product.pk)
        sold_after_release = released.is_set()
    finally:
        thread.join(10)
    assert order_id is not None
    assert sold_after_release  # it sold only once the holder had let go
    assert tasks.sell_one_task(product.pk) is None  # sold out


def test_the_task_is_a_celery_task_too() -> None:
    """Celery is in the dev extra: the decorated function is registered as a Celery task."""
    product = Product.objects.create(name="celery", stock=1)
    result = tasks.celery_sell_one.apply(args=(product.pk,))  # runs here, no broker
    assert result.successful(), result.traceback
    assert Order.objects.get(pk=result.get()).strategy == "task"
    assert tasks.celery_sell_one.name == "shop.sell_one"
