"""Fenced writes live at ``django_distlock.fencing``; the path of 0.x,
``django_distlock.optimistic.fencing``, keeps working for imports and for the
migrations already written with it (the shop's 0002 is one)."""

from __future__ import annotations

import importlib
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.writer import MigrationWriter

from django_distlock import fencing
from django_distlock.fencing import FencingTokenField
from testproject.shop import migrations as shop_migrations
from testproject.shop.models import Product

from .conftest import DATABASES

pytestmark = pytest.mark.django_versions

OLD_PATH = "django_distlock.optimistic.fencing.FencingTokenField"
#: The shop's migration that froze the old path.
OLD_MIGRATION = ("shop", "0002_version_and_fencing_token")


def test_the_old_module_re_exports_every_name() -> None:
    old = importlib.import_module("django_distlock.optimistic.fencing")
    assert old.__all__ == fencing.__all__
    for name in fencing.__all__:
        assert getattr(old, name) is getattr(fencing, name), name


def test_deconstruct_gives_the_public_path() -> None:
    name, path, args, kwargs = Product._meta.get_field("fencing_token").deconstruct()
    assert (name, path, args, kwargs) == (
        "fencing_token",
        "django_distlock.fencing.FencingTokenField",
        [],
        {},
    )
    written, imports = MigrationWriter.serialize(FencingTokenField())
    assert written == "django_distlock.fencing.FencingTokenField()"
    assert imports == {"import django_distlock.fencing"}


def test_a_subclass_keeps_its_own_path() -> None:
    class Renamed(FencingTokenField):
        pass

    assert (
        Renamed().deconstruct()[1]
        == f"{__name__}.test_a_subclass_keeps_its_own_path.<locals>.Renamed"
    )


def test_a_migration_written_with_the_old_path_loads() -> None:
    text = (Path(shop_migrations.__file__).parent / f"{OLD_MIGRATION[1]}.py").read_text()
    assert f"{OLD_PATH}()" in text  # the file under test still names the old path
    loader = MigrationLoader(None, ignore_no_migrations=True)
    field = loader.get_migration(*OLD_MIGRATION).operations[0].field
    assert type(field) is FencingTokenField
    state = loader.project_state(OLD_MIGRATION)
    assert type(state.apps.get_model("shop", "Product")._meta.get_field("fencing_token")) is (
        FencingTokenField
    )


@pytest.mark.django_db
def test_no_new_migration_for_the_moved_field() -> None:
    """The autodetector compares deconstructed fields: the old path in a migration
    and the new one on the model are the same field, so nothing is to be written."""
    out = StringIO()
    call_command("makemigrations", "shop", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("database", DATABASES)
def test_the_old_path_migration_applies(database: str) -> None:
    """Unapply the shop's 0002 and apply it again, on SQLite and PostgreSQL: the
    column comes back and takes fenced writes."""
    connection = connections[database]
    executor = MigrationExecutor(connection)
    executor.migrate([("shop", "0001_initial")])
    with connection.cursor() as cursor:
        columns = [
            c.name for c in connection.introspection.get_table_description(cursor, "shop_product")
        ]
    assert "fencing_token" not in columns
    executor = MigrationExecutor(connection)
    executor.migrate([OLD_MIGRATION])
    with connection.cursor() as cursor:
        columns = [
            c.name for c in connection.introspection.get_table_description(cursor, "shop_product")
        ]
    assert "fencing_token" in columns
    product = Product.objects.using(database).create(name="p", stock=1)
    fencing.fenced_save(product, 7, using=database)
    assert Product.objects.using(database).get(pk=product.pk).fencing_token == 7
