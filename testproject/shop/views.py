"""Views of the shop."""

from __future__ import annotations

import socket

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from django_distlock import distlock
from django_distlock.http import locked_response

from . import services
from .models import Product


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
