"""Fenced writes live at ``django_distlock.contrib.optimistic.fencing``: the path a
:class:`FencingTokenField` gives migrations, and the shop's migration that adds one."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.writer import MigrationWriter

from django_distlock.contrib.optimistic import fencing
from django_distlock.contrib.optimistic.fencing import FencingTokenField
from testproject.shop.models import Product

from .conftest import DATABASES, LIBRARY_DB

pytestmark = pytest.mark.django_versions

#: The shop's migration that creates its ``FencingTokenField``.
MIGRATION = ("shop", "0001_initial")


def test_deconstruct_gives_the_public_path() -> None:
    name, path, args, kwargs = Product._meta.get_field("fencing_token").deconstruct()
    assert (name, path, args, kwargs) == (
        "fencing_token",
        "django_distlock.contrib.optimistic.fencing.FencingTokenField",
        [],
        {},
    )
    written, imports = MigrationWriter.serialize(FencingTokenField())
    assert written == "django_distlock.contrib.optimistic.fencing.FencingTokenField()"
    assert imports == {"import django_distlock.contrib.optimistic.fencing"}


def test_a_subclass_keeps_its_own_path() -> None:
    class Renamed(FencingTokenField):
        pass

    assert (
        Renamed().deconstruct()[1]
        == f"{__name__}.test_a_subclass_keeps_its_own_path.<locals>.Renamed"
    )


@pytest.mark.django_db(databases=DATABASES)  # with a router, every database's history is read
def test_no_new_migration_for_the_field() -> None:
    """The autodetector compares deconstructed fields: the path in the shop's migration
    is the one the model's field gives, so nothing is to be written."""
    out = StringIO()
    call_command("makemigrations", "shop", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@LIBRARY_DB
@pytest.mark.parametrize("database", DATABASES)
def test_the_fencing_migration_applies(database: str) -> None:
    """Unapply the shop's migration and apply it again, on SQLite and PostgreSQL: the
    column comes back and takes fenced writes."""
    connection = connections[database]
    executor = MigrationExecutor(connection)
    executor.migrate([("shop", None)])
    with connection.cursor() as cursor:
        assert "shop_product" not in connection.introspection.table_names(cursor)
    executor = MigrationExecutor(connection)
    executor.migrate([MIGRATION])
    with connection.cursor() as cursor:
        columns = [
            c.name for c in connection.introspection.get_table_description(cursor, "shop_product")
        ]
    assert "fencing_token" in columns
    product = Product.objects.using(database).create(name="p", stock=1)
    fencing.fenced_save(product, 7, using=database)
    assert Product.objects.using(database).get(pk=product.pk).fencing_token == 7
