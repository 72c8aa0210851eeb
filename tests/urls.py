from django.contrib import admin
from django.urls import include, path

from django_distlock.dashboard.health import health_view

urlpatterns: list = [
    path("admin/", admin.site.urls),
    path("shop/", include("testproject.shop.urls")),
    path("distlock/health/", health_view),
]
