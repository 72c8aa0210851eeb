"""The flash sale's database work in the parent process: migrate, reset, count."""

from __future__ import annotations

from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Sum

from ..models import Order, Product


def migrate_if_needed(database: str = "default") -> None:
    """Apply pending migrations to ``database``, quietly (a fresh checkout has none applied).

    :raises CommandError: when the database cannot be reached or migrated.
    """
    try:
        executor = MigrationExecutor(connections[database])
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            call_command("migrate", database=database, interactive=False, verbosity=0)
    except DatabaseError as exc:
        raise CommandError(f"Could not migrate database {database!r}: {exc}") from exc


def reset_product(label: str, stock: int) -> Product:
    """Return the product of the strategy ``label`` with ``stock`` units and no orders."""
    product, _ = Product.objects.update_or_create(
        name=f"Flash sale: {label}", defaults={"stock": stock}
    )
    Order.objects.filter(product=product).delete()
    return product


def sales(product: Product) -> tuple[int, int]:
    """Return (units in orders, stock left) of ``product``, as the database has them."""
    product.refresh_from_db(fields=["stock"])
    units = Order.objects.filter(product=product).aggregate(units=Sum("quantity"))["units"]
    return units or 0, product.stock


def describe_database() -> str:
    """Name the default database for the report header: ``sqlite (/path/db.sqlite3)``."""
    connection = connections["default"]
    return f"{connection.vendor} ({connection.settings_dict['NAME']})"
