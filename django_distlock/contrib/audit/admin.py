"""The audit trail in the admin (read-only), and its activity page."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import URLPattern, path

from . import activity
from .models import LockEvent


@admin.register(LockEvent)
class LockEventAdmin(admin.ModelAdmin):
    """The audit trail (read-only), and the URL of the activity page."""

    list_display = [
        "at", "kind", "alias", "name", "fencing_token", "owner", "host", "context", "actor",
    ]
    list_filter = ["kind", "alias"]
    search_fields = ["name"]
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) or activity.can_view(request)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(partial(activity.activity_view, site=self.admin_site))
        return [
            path("activity/", view, name="django_distlock_activity"),
            *super().get_urls(),
        ]
