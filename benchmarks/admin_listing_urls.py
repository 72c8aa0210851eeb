"""URLs of ``benchmarks/admin_listing.py``: the admin only."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
