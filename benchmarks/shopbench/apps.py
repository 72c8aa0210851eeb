from django.apps import AppConfig


class ShopBenchConfig(AppConfig):
    """The benchmark-only app (label ``shopbench``)."""

    name = "benchmarks.shopbench"
    label = "shopbench"
    default_auto_field = "django.db.models.BigAutoField"
