"""The held-locks pages of the admin: the admin home's "Held locks" entry, and their URLs."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from . import bulk, views
from .models import HeldLock


@admin.register(HeldLock)
class HeldLockAdmin(admin.ModelAdmin):
    """The admin home's "Held locks" entry: it opens the held-locks page."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return views.can_view(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return views.can_view(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site

        def wrap(view: Any) -> Any:
            return site.admin_view(partial(view, site=site))

        return [
            path("held/", wrap(views.held_locks_view), name="django_distlock_held_locks"),
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

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not views.can_view(request):
            return super().changelist_view(request, extra_context)  # the admin's 403
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_distlock_held_locks"))
