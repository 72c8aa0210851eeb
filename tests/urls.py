from collections.abc import Callable

from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path

from django_distlock import distlock, locks
from django_distlock.health import health_view


@distlock("ctx:{name}", timeout=2)
def holding_view(request: HttpRequest, name: str) -> JsonResponse:
    """Lists, while it holds its lock, what the listing says its holders are doing."""
    infos = locks["default"].held_locks(prefix="ctx:")
    return JsonResponse({"contexts": [info.context for info in infos]})


def _lister(alias: str) -> Callable[..., JsonResponse]:
    def holding(request: HttpRequest, name: str) -> JsonResponse:
        infos = locks[alias].held_locks(prefix="ctx:")
        return JsonResponse({"held": [[i.name, i.host, i.context] for i in infos]})

    return holding


_views: dict[tuple[str, str], Callable[..., JsonResponse]] = {}


def holding_on(request: HttpRequest, alias: str, kind: str, name: str) -> JsonResponse:
    """A ``@distlock`` view of ``alias`` and ``kind`` (built once per pair): lists, while
    it holds ``ctx:<name>``, every holder's name, host and context."""
    if (alias, kind) not in _views:
        limit = 2 if kind == "semaphore" else None
        decorate = distlock("ctx:{name}", using=alias, kind=kind, limit=limit, timeout=5)
        _views[alias, kind] = decorate(_lister(alias))
    return _views[alias, kind](request, name)


urlpatterns: list = [
    path("admin/", admin.site.urls),
    path("shop/", include("testproject.shop.urls")),
    path("distlock/health/", health_view),
    path("distlock/holding/<path:name>", holding_view),
    path("distlock/holding-on/<alias>/<kind>/<path:name>", holding_on),
]
