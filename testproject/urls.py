"""URLs of the demo shop project."""

from django.conf import settings
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("shop/", include("testproject.shop.urls")),
]
if "debug_toolbar" in settings.INSTALLED_APPS:  # SHOP_DEBUG_TOOLBAR=1 (settings.py)
    urlpatterns.append(path("__debug__/", include("debug_toolbar.urls")))
