from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path

from django_distlock import distlock, locks
from django_distlock.dashboard.health import health_view


@distlock("ctx:{name}", timeout=2)
def holding_view(request: HttpRequest, name: str) -> JsonResponse:
    """Lists, while it holds its lock, what the listing says its holders are doing."""
    infos = locks["default"].held_locks(prefix="ctx:")
    return JsonResponse({"contexts": [info.context for info in infos]})


urlpatterns: list = [
    path("admin/", admin.site.urls),
    path("shop/", include("testproject.shop.urls")),
    path("distlock/health/", health_view),
    path("distlock/holding/<path:name>", holding_view),
]
