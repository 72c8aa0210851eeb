from django.contrib import admin
from django.db.models import Count, QuerySet, Sum
from django.http import HttpRequest

from django_distlock.contrib.optimistic.admin import OptimisticAdminMixin

from .models import Order, Product


@admin.register(Product)
class ProductAdmin(OptimisticAdminMixin, admin.ModelAdmin):
    """Products; two staff users editing one product at once cannot overwrite each other."""

    list_display = ["name", "price", "stock", "version", "order_count", "units_sold"]
    list_editable = ["price", "stock"]
    search_fields = ["name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Product]:
        return (
            super()
            .get_queryset(request)
            .annotate(order_count=Count("orders"), units_sold=Sum("orders__quantity"))
        )

    @admin.display(description="orders", ordering="order_count")
    def order_count(self, product: Product) -> int:
        return product.order_count  # type: ignore[attr-defined]

    @admin.display(description="units sold", ordering="units_sold")
    def units_sold(self, product: Product) -> int:
        return product.units_sold or 0  # type: ignore[attr-defined]


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "product", "quantity", "strategy", "worker", "pid", "created_at"]
    list_filter = ["strategy", "product"]
    list_select_related = ["product"]
    search_fields = ["product__name", "strategy", "worker"]
    date_hierarchy = "created_at"
    readonly_fields = ["created_at"]
