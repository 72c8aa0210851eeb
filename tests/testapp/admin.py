"""Admin registrations of the test app (the optimistic admin tests use them)."""

from typing import Any

from django.contrib import admin
from django.db.models import F, QuerySet
from django.http import HttpRequest

from django_distlock.contrib.optimistic.admin import OptimisticAdminMixin

from .admin_models import Article, ArticleNoActions, Memo
from .optimistic_models import Account


@admin.register(Article)
class ArticleAdmin(OptimisticAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["title", "status", "price"]
    list_editable = ["status", "price"]
    actions = ["mark_live"]

    @admin.action(description="Mark selected articles live")
    def mark_live(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        queryset.update(status="live", version=F("version") + 1)


@admin.register(ArticleNoActions)
class ArticleNoActionsAdmin(OptimisticAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["title", "status", "price"]
    list_editable = ["status", "price"]
    actions = None


@admin.register(Memo)
class MemoAdmin(OptimisticAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    fieldsets = [(None, {"fields": ["text"]})]


ACCOUNT_FIELDS = ["username", "count", "limit", "amount", "ratio", "ref", "address", "shelf"]


@admin.register(Account)
class AccountAdmin(OptimisticAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    fields = ACCOUNT_FIELDS
    list_display = ["id", *ACCOUNT_FIELDS]
    list_editable = ACCOUNT_FIELDS
