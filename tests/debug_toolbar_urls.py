"""The URLs of ``tests/debug_toolbar_settings.py``: the toolbar's, and ``/order/<pk>/``,
which takes two locks, one of them twice over (the second time a try-lock that finds it
busy), and answers a page."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import include, path

from django_distlock import locks


def order(request: HttpRequest, pk: int) -> HttpResponse:

    with locks["locmem"].lock(f"order:{pk}", timeout=1) as held:
        with locks["locmem"].lock(f"stock:{pk}", timeout=1):
            pass
        busy = locks["locmem"].lock(f"order:{pk}", blocking=False).acquire()
    return HttpResponse(f"<html><body>order {pk}: token {held.fencing_token}, "
                        f"again: {busy}</body></html>")


urlpatterns = [
    path("order/<int:pk>/", order),
    path("__debug__/", include("debug_toolbar.urls")),
]
