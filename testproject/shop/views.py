"""Views of the shop."""

from __future__ import annotations

import socket

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods, require_POST

from django_distlock import caching, distlock, locks
from django_distlock.exceptions import LockNotAcquired
from django_distlock.http import locked_response

from . import services
from .models import Order, Product


@require_POST
@distlock("stock:{product_id}", on_fail=locked_response, timeout=2)
def buy(request: HttpRequest, product_id: int) -> JsonResponse:
    """Sell one unit of a product: 201 with the order, 409 when sold out, 404 when unknown.

    The stock lock (alias ``default``) serialises the read-check-decrement of
    concurrent requests, on every web worker; a request that waits more than
    2 s for it gets 423 Locked.
    """
    try:
        order = services.sell_one(product_id, strategy="view", worker=socket.gethostname())
    except Product.DoesNotExist:
        return JsonResponse({"error": f"No product {product_id}."}, status=404)
    if order is None:
        return JsonResponse({"bought": False, "reason": "sold out"}, status=409)
    return JsonResponse(
        {"bought": True, "order": order.pk, "stock": order.product.stock}, status=201
    )


def product(request: HttpRequest, product_id: int) -> JsonResponse:
    """The product page's data: 200 with name, price and stock, 404 when unknown.

    Served from the cache: when it expires, one web worker reads the product again
    while the others keep answering with the previous card (``stale``), so a sale's
    crowd refreshing the page never sends every request to the database. The stock
    shown may lag the sales by up to the card's 5 s (the sale itself reads the row).
    """
    card = product_card(product_id)
    if card is None:
        return JsonResponse({"error": f"No product {product_id}."}, status=404)
    return JsonResponse(card)


@require_http_methods(["GET", "POST"])
def product_page(request: HttpRequest, product_id: int) -> HttpResponse:
    """The product's page (HTML): its card, and a button that buys one (POST, under the
    stock lock as :func:`buy`; a sale that waits more than 2 s for it says busy).

    With ``SHOP_DEBUG_TOOLBAR=1`` (testproject/settings.py) django-debug-toolbar shows
    the locks the request took in its "Locks" panel: the stock lock with its fencing
    token, and the card's rebuild lock on a cache miss. The stock shown is the card's
    (up to 5 s old), or after a sale the stock that sale left.
    """
    context: dict[str, object] = {}
    if request.method == "POST":
        try:
            with locks["default"].lock(services.stock_lock_name(product_id),
                                       timeout=2) as held:
                order = services.sell_one(product_id, strategy="page",
                                          worker=socket.gethostname(), fence=held)
        except Product.DoesNotExist:
            raise Http404(f"No product {product_id}.") from None
        except LockNotAcquired:
            context["busy"] = True
        else:
            context.update(bought=order, sold_out=order is None, token=held.fencing_token)
    card = product_card(product_id)
    if card is None:
        raise Http404(f"No product {product_id}.")
    bought = context.get("bought")
    stock = bought.product.stock if isinstance(bought, Order) else card["stock"]
    return render(request, "shop/product.html", {**context, "card": card, "stock": stock})


@caching.cached("shop:product:{product_id}", timeout=5, stale=30)
def product_card(product_id: int) -> dict[str, object] | None:
    """The product's card as the page shows it (None for an unknown product: cached too)."""
    found = Product.objects.filter(pk=product_id).values("pk", "name", "price", "stock").first()
    if found is None:
        return None
    return {**found, "price": str(found["price"])}
