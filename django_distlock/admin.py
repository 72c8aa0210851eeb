"""The admin of django-distlock: the audit trail, and the held-locks pages beside it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

from .dashboard import activity, bulk, views
from .models import LockEvent


@admin.register(LockEvent)
class LockEventAdmin(admin.ModelAdmin):
    """The audit trail (read-only), and the URLs of the held-locks pages."""

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
        return super().has_module_permission(request) or views.can_view(request)

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site

        def wrap(view: Any) -> Any:
            def bound(request: HttpRequest) -> HttpResponse:
                return view(request, site)

            return site.admin_view(bound)

        return [
            path("held/", wrap(views.held_locks_view), name="django_distlock_held_locks"),
            path("activity/", wrap(activity.activity_view), name="django_distlock_activity"),
            path("held/lock/", wrap(views.lock_detail_view), name="django_distlock_held_lock"),
            path(
                "held/release/",
                wrap(views.force_release_view),
                name="django_distlock_force_release",
            ),
            path(
                "held/release-bulk/",
                wrap(bulk.bulk_release_view),
                name="django_distlock_bulk_release",
            ),
            *super().get_urls(),
        ]
