"""Optimistic locking: the version-checked save and delete, and the retry helpers.

Every behaviour runs on SQLite ("default") and PostgreSQL ("pg"). Concurrency:
threads (as the issue asks) for the retry decorator, OS processes for the
stock decrement with ``update_with_retry``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django import forms
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, OperationalError, connections, models, transaction
from django.db.models import F, Value
from django.db.models.functions import Upper
from django.db.models.signals import post_save, pre_save
from django.test.utils import CaptureQueriesContext, isolate_apps

from django_distlock import locks
from django_distlock.contrib.optimistic import (
    OptimisticLockMixin,
    VersionField,
    get_version,
    retry_on_conflict,
    update_with_retry,
    version_field,
)
from django_distlock.contrib.optimistic.mixin import _keep_the_version_newest
from django_distlock.exceptions import VersionConflict
from tests.testapp.models import (
    Item,
    ItemProxy,
    Kiosk,
    KioskProxy,
    Place,
    PlainItem,
    PlainShop,
    PlainSite,
    RevisedItem,
    Shelf,
    Shop,
    Stall,
    StampedItem,
    Tagged,
    UuidKiosk,
)

from .conftest import LIBRARY_DB, in_thread, require_pg

pytestmark = [
    pytest.mark.django_versions,
    LIBRARY_DB,
]
FORK = multiprocessing.get_context("fork")


@pytest.fixture(params=["default", "pg"])
def alias(request: pytest.FixtureRequest) -> str:
    if request.param == "pg":
        require_pg()
    return str(request.param)


def _row(model: type[models.Model], alias: str, pk: Any) -> dict[str, Any]:
    return model._base_manager.using(alias).filter(pk=pk).values().get()


def _queries(alias: str) -> CaptureQueriesContext:
    return CaptureQueriesContext(connections[alias])


# --- the checked save ---------------------------------------------------------------------


def test_new_instance_is_inserted_at_version_1(alias: str) -> None:
    item = Item(name="pen", stock=3)
    item.save(using=alias)
    assert item.version == 1 and get_version(item) == 1
    assert _row(Item, alias, item.pk)["version"] == 1
    assert Item.objects.using(alias).create(name="cap").version == 1


def test_save_is_one_guarded_update_that_bumps_the_version(alias: str) -> None:
    item = Item.objects.using(alias).create(name="pen", stock=3)
    item.stock = 2
    with _queries(alias) as ctx:
        item.save()
    assert len(ctx.captured_queries) == 1
    sql = ctx.captured_queries[0]["sql"]
    assert sql.upper().startswith("UPDATE")
    assert '"version"' in sql.split("WHERE", 1)[1]
    assert item.version == 2
    row = _row(Item, alias, item.pk)
    assert (row["stock"], row["version"]) == (2, 2)
    item.save()
    assert item.version == 3 == _row(Item, alias, item.pk)["version"]


@pytest.mark.parametrize("update_fields", [None, ["stock"]])
def test_query_count_equals_a_plain_models_save(alias: str, update_fields: Any) -> None:
    plain = PlainItem.objects.using(alias).create(name="pen")
    item = Item.objects.using(alias).create(name="pen")
    with _queries(alias) as plain_ctx:
        plain.stock = 5
        plain.save(update_fields=update_fields)
    with _queries(alias) as mixin_ctx:
        item.stock = 5
        item.save(update_fields=update_fields)
    assert len(mixin_ctx.captured_queries) == len(plain_ctx.captured_queries) == 1


def test_two_readers_exactly_one_wins(alias: str) -> None:
    pk = Item.objects.using(alias).create(name="pen", stock=10).pk
    first = Item.objects.using(alias).get(pk=pk)
    second = Item.objects.using(alias).get(pk=pk)
    first.stock, first.note = 9, "first"
    second.stock, second.note = 8, "second"
    first.save()
    with pytest.raises(VersionConflict) as info:
        second.save()
    error = info.value
    assert error.instance is second and error.expected_version == 1
    message = str(error)
    assert "testapp.Item" in message and f"pk={pk}" in message and "version 1" in message
    assert "changed or deleted since it was read" in message
    assert second.version == 1  # unchanged by the refused save
    row = _row(Item, alias, pk)
    assert (row["stock"], row["note"], row["version"]) == (9, "first", 2)


def test_update_fields_writes_only_those_fields_and_is_checked(alias: str) -> None:
    pk = Item.objects.using(alias).create(name="pen", stock=10, note="n").pk
    first = Item.objects.using(alias).get(pk=pk)
    second = Item.objects.using(alias).get(pk=pk)
    first.stock, first.name = 9, "not saved"
    with _queries(alias) as ctx:
        first.save(update_fields=["stock"])
    set_clause = ctx.captured_queries[0]["sql"].split("WHERE")[0]
    assert '"stock"' in set_clause and '"version"' in set_clause and '"name"' not in set_clause
    assert first.version == 2
    second.note = "stale"
    with pytest.raises(VersionConflict):
        second.save(update_fields=["note"])
    row = _row(Item, alias, pk)
    assert (row["name"], row["stock"], row["note"], row["version"]) == ("pen", 9, "n", 2)


def test_update_fields_are_validated_and_empty_is_a_no_op(alias: str) -> None:
    item = Item.objects.using(alias).create(name="pen")
    item.name = "changed"
    with pytest.raises(ValueError, match=r"do not exist in this model.*nope"):
        item.save(update_fields=["name", "nope"])
    with pytest.raises(ValueError, match="id"):
        item.save(update_fields=["id"])
    sent: list[Any] = []
    pre_save.connect(sent.append, sender=Item, weak=False, dispatch_uid="t-empty")
    try:
        with _queries(alias) as ctx:
            item.save(update_fields=[])
    finally:
        pre_save.disconnect(sender=Item, dispatch_uid="t-empty")
    assert ctx.captured_queries == [] and sent == []
    assert item.version == 1
    assert _row(Item, alias, item.pk)["name"] == "pen"


def test_saving_a_deleted_row_conflicts_instead_of_inserting(alias: str) -> None:
    item = Item.objects.using(alias).create(name="pen")
    Item.objects.using(alias).filter(pk=item.pk).delete()
    with pytest.raises(VersionConflict, match="changed or deleted"):
        item.save()
    with pytest.raises(VersionConflict):
        item.save(force_update=True)
    assert not Item.objects.using(alias).exists()


def test_force_update_checks_the_version(alias: str) -> None:
    pk = Item.objects.using(alias).create(name="pen").pk
    stale = Item.objects.using(alias).get(pk=pk)
    Item.objects.using(alias).get(pk=pk).save()
    with pytest.raises(VersionConflict):
        stale.save(force_update=True)
    fresh = Item.objects.using(alias).get(pk=pk)
    fresh.save(force_update=True)
    assert fresh.version == 3


def test_new_instance_with_an_explicit_pk_is_inserted_not_blindly_updated(alias: str) -> None:
    existing = Item.objects.using(alias).create(name="pen", stock=5)
    existing.save()  # version 2
    with pytest.raises(IntegrityError):
        Item(pk=existing.pk, name="intruder").save(using=alias)
    row = _row(Item, alias, existing.pk)
    assert (row["name"], row["version"]) == ("pen", 2)
    before = time.time_ns() // 1000
    Item(pk=existing.pk + 100, name="new").save(using=alias)
    assert _row(Item, alias, existing.pk + 100)["version"] >= before  # a given key: the clock


def test_a_row_created_again_with_its_pk_never_reuses_a_version(alias: str) -> None:
    """Issue 20, item 18: a reader of the deleted row must not win over the new one."""
    item = Item.objects.using(alias).create(name="pen")
    item.save()  # version 2
    reader = Item.objects.using(alias).get(pk=item.pk)
    Item.objects.using(alias).filter(pk=item.pk).delete()
    before = time.time_ns() // 1000
    again = Item.objects.using(alias).create(pk=item.pk, name="again", version=1)
    # The version the instance carries is not the row's (it was never read): the clock.
    assert again.version >= before and _row(Item, alias, item.pk)["version"] == again.version
    again.stock = 5
    again.save()  # edited once: with +1 from 1 this would be the reader's version 2
    reader.name = "stale"
    with pytest.raises(VersionConflict):
        reader.save()
    assert _row(Item, alias, item.pk)["name"] == "again"
    Item.objects.using(alias).filter(pk=item.pk).delete()
    Item.objects.using(alias).bulk_create([Item(pk=item.pk, name="bulk", version=2)])
    with pytest.raises(VersionConflict):
        reader.save()
    assert _row(Item, alias, item.pk)["version"] >= before


def test_signals_are_sent_like_djangos_save(alias: str) -> None:
    item = ItemProxy.objects.using(alias).create(name="pen")
    received: list[tuple[str, dict[str, Any]]] = []

    def on_pre(**kwargs: Any) -> None:
        received.append(("pre", kwargs))

    def on_post(**kwargs: Any) -> None:
        received.append(("post", {**kwargs, "version_then": kwargs["instance"].version}))

    pre_save.connect(on_pre, sender=ItemProxy, dispatch_uid="t-pre")
    post_save.connect(on_post, sender=ItemProxy, dispatch_uid="t-post")
    try:
        item.save()
        item.save(update_fields=["note"])
        stale = ItemProxy.objects.using(alias).get(pk=item.pk)
        Item.objects.using(alias).get(pk=item.pk).save()
        received_before_conflict = len(received)
        with pytest.raises(VersionConflict):
            stale.save()
    finally:
        pre_save.disconnect(sender=ItemProxy, dispatch_uid="t-pre")
        post_save.disconnect(sender=ItemProxy, dispatch_uid="t-post")
    kinds = [kind for kind, _ in received]
    assert kinds == ["pre", "post", "pre", "post", "pre"]
    assert received_before_conflict == 4
    for kind, kwargs in received[:4]:
        assert kwargs["sender"] is ItemProxy and kwargs["raw"] is False
        assert kwargs["using"] == alias
        assert kwargs["instance"] is item
        if kind == "post":
            assert kwargs["created"] is False
    assert received[0][1]["update_fields"] is None
    assert received[2][1]["update_fields"] == frozenset({"note", "version"})
    assert received[3][1]["update_fields"] == frozenset({"note", "version"})
    assert received[1][1]["version_then"] == 2  # post_save sees the bumped version
    assert received[3][1]["version_then"] == 3


def test_renamed_version_field(alias: str) -> None:
    assert version_field(RevisedItem).name == "revision"
    assert "version" not in {f.name for f in RevisedItem._meta.get_fields()}
    pk = RevisedItem.objects.using(alias).create(name="a").pk
    first = RevisedItem.objects.using(alias).get(pk=pk)
    second = RevisedItem.objects.using(alias).get(pk=pk)
    first.name = "first"
    first.save()
    assert get_version(first) == 2
    second.name = "second"
    with pytest.raises(VersionConflict):
        second.save()
    with pytest.raises(VersionConflict):
        second.delete()
    row = _row(RevisedItem, alias, pk)
    assert (row["name"], row["revision"]) == ("first", 2)


def test_auto_now_is_stamped_by_a_checked_save(alias: str) -> None:
    item = StampedItem.objects.using(alias).create(name="a")
    stamped = _row(StampedItem, alias, item.pk)["touched"]
    item.save()
    assert _row(StampedItem, alias, item.pk)["touched"] > stamped
    stamped = _row(StampedItem, alias, item.pk)["touched"]
    item.save(update_fields=["name"])  # like Django: auto_now only when listed
    assert _row(StampedItem, alias, item.pk)["touched"] == stamped
    item.save(update_fields=["touched"])
    assert _row(StampedItem, alias, item.pk)["touched"] > stamped


def test_unsaved_related_object_is_refused_and_a_later_saved_one_is_linked(alias: str) -> None:
    item = Item.objects.using(alias).create(name="pen")
    item.shelf = Shelf()
    with pytest.raises(ValueError, match="unsaved related object 'shelf'"):
        item.save()
    assert item.version == 1 and _row(Item, alias, item.pk)["version"] == 1
    shelf = Shelf(label="top")
    item.shelf = shelf
    shelf.save(using=alias)
    item.save()
    assert _row(Item, alias, item.pk)["shelf_id"] == shelf.pk


def test_unsaved_object_in_a_generic_foreign_key_is_refused_like_djangos_save(alias: str) -> None:
    shelf = Shelf.objects.using(alias).create(label="kept")
    tagged = Tagged.objects.using(alias).create(target=shelf)
    unsaved = Shelf(label="never saved")
    unsaved._state.db = alias  # its content type is then read from this database
    tagged.target = unsaved  # sets object_id to None
    with pytest.raises(ValueError, match="unsaved related object 'target'"):
        tagged.save()
    row = _row(Tagged, alias, tagged.pk)
    assert (row["object_id"], row["version"]) == (shelf.pk, 1)  # not wiped
    assert tagged.version == 1
    other = Shelf.objects.using(alias).create(label="other")
    tagged.target = other
    tagged.save()
    assert (_row(Tagged, alias, tagged.pk)["object_id"], tagged.version) == (other.pk, 2)


def test_expression_values_are_written_and_still_version_checked(alias: str) -> None:
    pk = Item.objects.using(alias).create(name="pen", stock=5).pk
    item = Item.objects.using(alias).get(pk=pk)
    stale = Item.objects.using(alias).get(pk=pk)
    item.stock = F("stock") - 1
    item.name = Upper(Value("pen"))
    with _queries(alias) as ctx:
        item.save()
    assert len(ctx.captured_queries) == 1 and item.version == 2
    assert (_row(Item, alias, pk)["stock"], _row(Item, alias, pk)["name"]) == (4, "PEN")
    stale.stock = F("stock") - 1
    with pytest.raises(VersionConflict):
        stale.save(update_fields=["stock"])
    assert stale.version == 1
    assert (_row(Item, alias, pk)["stock"], _row(Item, alias, pk)["version"]) == (4, 2)


class _Shown(models.Manager["models.Model"]):
    def get_queryset(self) -> models.QuerySet[Any]:
        return super().get_queryset().filter(hidden=False)


@isolate_apps("tests.testapp")
def test_a_filtering_base_manager_is_honoured_like_djangos_save(alias: str) -> None:
    class Hideable(OptimisticLockMixin):
        hidden = models.BooleanField(default=False)
        stock = models.IntegerField(default=0)
        objects = models.Manager()
        shown = _Shown()

        class Meta:
            app_label = "testapp"
            base_manager_name = "shown"

    with connections[alias].schema_editor() as editor:
        editor.create_model(Hideable)
    try:
        visible = Hideable.objects.using(alias).create()
        visible.stock = 1
        visible.save()
        hidden = Hideable.objects.using(alias).create(hidden=True)
        hidden.stock = 1
        # Django's save would not see the row either: its UPDATE goes through the base manager.
        with pytest.raises(VersionConflict, match=r"base manager .*does not show it"):
            hidden.save()
        rows = dict(Hideable.objects.using(alias).values_list("pk", "stock"))
        assert rows == {visible.pk: 1, hidden.pk: 0}
        # Django's delete() deletes a row its base manager hides; so does a checked one.
        stale = Hideable.objects.using(alias).get(pk=hidden.pk)
        Hideable.objects.using(alias).filter(pk=hidden.pk).update(version=F("version") + 1)
        with pytest.raises(VersionConflict, match="changed or deleted since it was read"):
            stale.delete()
        fresh = Hideable.objects.using(alias).get(pk=hidden.pk)
        assert fresh.delete()[0] == 1
        assert not Hideable.objects.using(alias).filter(pk=hidden.pk).exists()
    finally:
        with connections[alias].schema_editor() as editor:
            editor.delete_model(Hideable)


def test_deferred_fields(alias: str) -> None:
    pk = Item.objects.using(alias).create(name="pen", note="keep").pk
    without_version = Item.objects.using(alias).only("name").get(pk=pk)
    without_version.name = "x"
    with pytest.raises(ValueError, match="version field 'version' was deferred"):
        without_version.save()
    partial = Item.objects.using(alias).defer("note").get(pk=pk)
    Item.objects.using(alias).filter(pk=pk).update(note="changed elsewhere")
    partial.name = "renamed"
    with _queries(alias) as ctx:
        partial.save()
    assert len(ctx.captured_queries) == 1
    assert '"note"' not in ctx.captured_queries[0]["sql"]
    row = _row(Item, alias, pk)
    assert (row["name"], row["note"], row["version"]) == ("renamed", "changed elsewhere", 2)


# --- multi-table inheritance ----------------------------------------------------------------


def test_multi_table_child_save_is_checked_and_costs_one_more_query(alias: str) -> None:
    plain = PlainShop.objects.using(alias).create(name="p")
    pk = Shop.objects.using(alias).create(name="s", stock=5).pk
    first = Shop.objects.using(alias).get(pk=pk)
    second = Shop.objects.using(alias).get(pk=pk)
    with _queries(alias) as plain_ctx:
        plain.stock = 4
        plain.save()
    with _queries(alias) as ctx:
        first.name, first.stock = "first", 4
        first.save()
    assert len(ctx.captured_queries) == len(plain_ctx.captured_queries) + 1
    assert first.version == 2
    second.name, second.stock = "second", 3
    with pytest.raises(VersionConflict):
        second.save()
    assert second.version == 1
    shop = Shop.objects.using(alias).get(pk=pk)
    assert (shop.name, shop.stock, shop.version) == ("first", 4, 2)
    first.stock = 2
    first.save(update_fields=["stock"])
    assert Shop.objects.using(alias).get(pk=pk).stock == 2
    with pytest.raises(VersionConflict):
        second.delete()
    assert Shop.objects.using(alias).filter(pk=pk).exists()
    first.delete()
    assert not Shop.objects.using(alias).exists()
    assert not Shop.__mro__[1]._base_manager.using(alias).filter(pk=pk).exists()


def test_multi_table_failed_save_rolls_the_bump_back(alias: str) -> None:
    shop = Shop.objects.using(alias).create(name="s", stock=5)

    def refuse(**kwargs: Any) -> None:
        raise RuntimeError("refused by a receiver")

    pre_save.connect(refuse, sender=Shop, dispatch_uid="t-refuse")
    try:
        shop.stock = 1
        with pytest.raises(RuntimeError, match="refused"):
            shop.save()
    finally:
        pre_save.disconnect(sender=Shop, dispatch_uid="t-refuse")
    assert shop.version == 1
    fresh = Shop.objects.using(alias).get(pk=shop.pk)
    assert (fresh.stock, fresh.version) == (5, 1)
    shop.save()  # the instance is still usable at its version
    assert Shop.objects.using(alias).get(pk=shop.pk).version == 2


# --- where Django's save() inserts ------------------------------------------------------------


@pytest.mark.parametrize("adding", [True, False])
def test_the_copy_idiom_starts_a_new_row_at_version_1(alias: str, adding: bool) -> None:
    original = Item.objects.using(alias).create(name="pen", stock=3)
    original.save()
    original.save()  # version 3
    copy = Item.objects.using(alias).get(pk=original.pk)
    copy.pk = None
    copy._state.adding = adding  # Django's documented idiom sets it; a plain pk = None works too
    copy.save()
    assert copy.pk != original.pk and copy.version == 1
    assert _row(Item, alias, copy.pk)["version"] == 1
    assert _row(Item, alias, original.pk)["version"] == 3
    copy.stock = 2
    copy.save()
    assert _row(Item, alias, copy.pk)["version"] == 2


def test_copying_a_multi_table_child_starts_both_rows_at_version_1(alias: str) -> None:
    original = Shop.objects.using(alias).create(name="s", stock=1)
    original.save()  # version 2
    copy = Shop.objects.using(alias).get(pk=original.pk)
    copy.pk = copy.id = None
    copy._state.adding = True
    copy.save()
    assert copy.pk != original.pk and copy.version == 1
    assert Shop.objects.using(alias).get(pk=copy.pk).version == 1
    assert Shop.objects.using(alias).get(pk=original.pk).version == 2


def test_a_child_for_an_existing_parent_row_never_lowers_its_version(alias: str) -> None:
    place = Place.objects.using(alias).create(name="corner")
    place.save()
    place.save()  # version 3
    reader = Place.objects.using(alias).get(pk=place.pk)
    # Built without the parent's version (a default 1): it cannot vouch for the row.
    with pytest.raises(VersionConflict, match="copy the parent's fields and its version"):
        Shop(place_ptr=place, stock=5).save(using=alias)
    assert Place.objects.using(alias).get(pk=place.pk).version == 3
    assert not Shop.objects.using(alias).exists()
    # Built from the parent as read: the parent's row is checked and its version bumped.
    shop = Shop(place_ptr=place, name=place.name, version=place.version, stock=5)
    shop.save(using=alias)
    assert shop.version == 4
    row = Shop.objects.using(alias).get(pk=place.pk)
    assert (row.name, row.stock, row.version) == ("corner", 5, 4)
    reader.name = "stale"
    with pytest.raises(VersionConflict):
        reader.save()


def test_a_new_child_of_a_new_parent_is_inserted_as_before(alias: str) -> None:
    with _queries(alias) as ctx:
        shop = Shop.objects.using(alias).create(name="new", stock=1)
    statements = [q["sql"].split()[0] for q in ctx]
    assert shop.version == 1
    assert [word for word in statements if word in ("SELECT", "UPDATE", "INSERT")] == [
        "INSERT",
        "INSERT",
    ]


def test_changing_a_loaded_instances_pk_inserts_like_djangos_save(alias: str) -> None:
    item = Item.objects.using(alias).create(name="pen", stock=3)
    item.save()  # version 2
    moved = Item.objects.using(alias).get(pk=item.pk)
    moved.pk = item.pk + 1000
    before = time.time_ns() // 1000
    moved.save()  # Django: no row with the new pk, so an INSERT (at the clock: a given key)
    assert _row(Item, alias, moved.pk)["name"] == "pen" and moved.version >= before
    assert _row(Item, alias, item.pk)["version"] == 2  # the row it was read from is untouched
    inserted = moved.version
    moved.stock = 1
    moved.save()  # from now on it is that new row
    assert _row(Item, alias, moved.pk)["version"] == inserted + 1
    # Onto a row that exists: Django would overwrite it unchecked; refused instead.
    onto = Item.objects.using(alias).get(pk=item.pk)
    onto.pk = moved.pk
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        onto.save()
    assert _row(Item, alias, moved.pk)["stock"] == 1


def test_positional_save_arguments_behave_as_djangos(alias: str) -> None:
    outcomes = []
    for model in (PlainItem, Item):
        obj = model.objects.using(alias).create(name="pen")
        obj.name = "positional"
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                obj.save(False, False, alias, ["name"])
        except TypeError as exc:
            outcomes.append(("TypeError", str(exc).split(" takes ")[-1]))
            continue
        row = _row(model, alias, obj.pk)
        outcomes.append((row["name"], [type(w.message).__name__ for w in seen]))
    assert outcomes[0] == outcomes[1]


# --- the version column in a multi-table child's table --------------------------------------


def test_a_child_holding_the_version_starts_at_1_when_the_database_assigns_its_key(
    alias: str,
) -> None:
    """Issue 32, finding 3: the child's key is the parent link, which Django sets from
    the parent row it has just inserted; that key is the database's, not the caller's."""
    with _queries(alias) as ctx:
        kiosk = Kiosk.objects.using(alias).create(name="north", stock=3)
    statements = [q["sql"].split()[0] for q in ctx]
    assert [word for word in statements if word != "BEGIN" and word != "COMMIT"] == ["INSERT"] * 2
    assert kiosk.version == 1 and _row(Kiosk, alias, kiosk.pk)["version"] == 1
    built = Kiosk(name="south")
    built.save(using=alias)
    assert built.version == 1 == _row(Kiosk, alias, built.pk)["version"]
    proxied = KioskProxy.objects.using(alias).create(name="proxy")
    assert proxied.version == 1 == _row(Kiosk, alias, proxied.pk)["version"]
    # A grandchild: the version is in its parent's table, keyed by that table's link.
    stall = Stall.objects.using(alias).create(name="stall", slot=2)
    assert stall.version == 1 == _row(Kiosk, alias, stall.pk)["version"]
    kiosk.stock = 2
    kiosk.save()
    assert kiosk.version == 2 == _row(Kiosk, alias, kiosk.pk)["version"]
    stale = Kiosk.objects.using(alias).get(pk=stall.pk)
    stall.slot = 3
    stall.save()
    assert stall.version == 2
    with pytest.raises(VersionConflict):
        stale.save()


@pytest.mark.parametrize("model", [Item, Kiosk])
def test_djangos_copy_idiom_starts_the_copy_at_1(alias: str, model: type[models.Model]) -> None:
    """Django's documented copy (pk and id set to None, ``_state.adding``), for a plain
    model and for a multi-table child holding the version."""
    original = model.objects.using(alias).create(name="pen")
    original.save()
    original.save()  # version 3
    copy = model.objects.using(alias).get(pk=original.pk)
    copy.pk = None
    copy.id = None  # type: ignore[attr-defined]
    copy._state.adding = True
    copy.save()
    assert copy.pk != original.pk and copy.version == 1  # type: ignore[attr-defined]
    assert _row(model, alias, copy.pk)["version"] == 1
    assert _row(model, alias, original.pk)["version"] == 3


def test_a_child_holding_the_version_with_a_given_key_starts_at_the_clock(alias: str) -> None:
    before = time.time_ns() // 1000
    taken = Kiosk.objects.using(alias).create(name="taken").pk
    by_pk = Kiosk.objects.using(alias).create(pk=taken + 100, name="pk")
    by_parent_key = Kiosk.objects.using(alias).create(id=taken + 200, name="id")
    stall = Stall.objects.using(alias).create(pk=taken + 300, name="stall")
    keyed = UuidKiosk.objects.using(alias).create(name="uuid")  # a key from a field default
    shop = Shop.objects.using(alias).create(pk=taken + 400, name="shop")  # version in the parent
    for obj, model in (
        (by_pk, Kiosk),
        (by_parent_key, Kiosk),
        (stall, Kiosk),
        (keyed, UuidKiosk),
        (shop, Place),
    ):
        assert obj.version >= before and _row(model, alias, obj.pk)["version"] == obj.version
    keyed.pk = keyed.id = None  # type: ignore[assignment]
    keyed._state.adding = True
    keyed.save()  # the copy idiom: the default gives the key again
    assert keyed.version >= before
    # A child deleted from its parent row and made again: the same key, never its versions.
    kiosk = Kiosk.objects.using(alias).create(name="again")
    kiosk.save()  # version 2
    reader = Kiosk.objects.using(alias).get(pk=kiosk.pk)
    Kiosk.objects.using(alias).get(pk=kiosk.pk).delete(keep_parents=True)
    site = PlainSite.objects.using(alias).get(pk=kiosk.pk)
    again = Kiosk(plainsite_ptr=site, name=site.name)
    again.save(using=alias)
    assert again.version >= before
    again.save()
    reader.stock = 9
    with pytest.raises(VersionConflict):
        reader.save()


# --- delete ---------------------------------------------------------------------------------


def test_stale_delete_is_refused_and_a_fresh_one_works(alias: str) -> None:
    pk = Item.objects.using(alias).create(name="pen").pk
    stale = Item.objects.using(alias).get(pk=pk)
    fresh = Item.objects.using(alias).get(pk=pk)
    fresh.stock = 1
    fresh.save()
    with pytest.raises(VersionConflict, match="changed or deleted since it was read"):
        stale.delete()
    assert Item.objects.using(alias).filter(pk=pk).exists()
    assert fresh.delete() == (1, {"testapp.Item": 1})
    assert not Item.objects.using(alias).filter(pk=pk).exists()
    with pytest.raises(VersionConflict):
        stale.delete()  # already deleted


def test_delete_without_pk_is_djangos_error() -> None:
    with pytest.raises(ValueError, match="attribute is set to None"):
        Item(name="never saved").delete()


# --- field, helpers and checks --------------------------------------------------------------


def test_version_field_is_not_editable_and_deconstructs_cleanly() -> None:
    form_class = forms.modelform_factory(Item, fields="__all__")
    assert "version" not in form_class.base_fields
    _, path, args, kwargs = VersionField().deconstruct()
    assert path == "django_distlock.contrib.optimistic.VersionField" and args == []
    assert "default" not in kwargs and "editable" not in kwargs
    assert VersionField(default=5).deconstruct()[3]["default"] == 5


def test_helpers_reject_bad_input() -> None:
    with pytest.raises(TypeError, match="model class or instance"):
        version_field("Item")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model instance"):
        get_version(Item)  # type: ignore[arg-type]
    with pytest.raises(ImproperlyConfigured, match="exactly one VersionField"):
        version_field(PlainItem)
    assert version_field(Item()) is version_field(Item)
    assert version_field(Shop).model is Shop.__mro__[1]


@isolate_apps("tests.testapp")
def test_system_checks_require_exactly_one_version_field() -> None:
    class NoVersion(OptimisticLockMixin):
        version = None  # type: ignore[assignment]

        class Meta:
            app_label = "testapp"

    class TwoVersions(OptimisticLockMixin):
        other = VersionField()

        class Meta:
            app_label = "testapp"

    class Loose(models.Model):
        counter = VersionField()

        class Meta:
            app_label = "testapp"

    for model in (NoVersion, TwoVersions):
        ids = [message.id for message in model.check()]
        assert ids == ["distlock.E101"], model
        with pytest.raises(ImproperlyConfigured, match="exactly one VersionField"):
            version_field(model)
    assert "other" in str(TwoVersions.check()[0].msg)
    assert [message.id for message in Loose.check()] == ["distlock.W101"]
    for model in (Item, RevisedItem, StampedItem, Shop):
        assert model.check() == []


# --- retry_on_conflict ----------------------------------------------------------------------


def _bump(alias: str, pk: Any) -> None:
    """Another writer: save the row once, so readers before it are stale."""
    Item.objects.using(alias).get(pk=pk).save()


def test_retry_on_conflict_retries_real_conflicts_then_returns(alias: str) -> None:
    pk = Item.objects.using(alias).create(stock=0).pk
    calls: list[int] = []

    @retry_on_conflict(attempts=4, base=0.001, cap=0.01)
    def increment(by: int) -> int:
        item = Item.objects.using(alias).get(pk=pk)
        calls.append(item.version)
        if len(calls) <= 2:
            _bump(alias, pk)  # a competitor writes between our read and our save
        item.stock += by
        item.save()
        return item.stock

    assert increment(3) == 3
    assert len(calls) == 3
    assert calls == [1, 2, 3]
    row = _row(Item, alias, pk)
    assert (row["stock"], row["version"]) == (3, 4)
    assert increment.__name__ == "increment"


def _snapshot_transaction(alias: str) -> None:
    """Start this transaction's snapshot the strictest way ``alias`` allows: REPEATABLE
    READ on PostgreSQL; on SQLite the caller's connection is DEFERRED (see below)."""
    if connections[alias].vendor == "postgresql":
        with connections[alias].cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def _with_deferred_sqlite(func: Any) -> Any:
    """Run ``func`` in a thread whose "default" connection uses SQLite's DEFERRED
    transactions, Django's default (the suite's settings say IMMEDIATE, which takes
    the write lock at BEGIN: no other writer could commit inside the transaction)."""

    def run() -> Any:
        deferred = connections.create_connection("default")
        options = {**deferred.settings_dict["OPTIONS"], "transaction_mode": "DEFERRED"}
        deferred.settings_dict = {**deferred.settings_dict, "OPTIONS": options}
        connections["default"] = deferred
        return func()

    return in_thread(run)


def test_retry_on_conflict_retries_a_transaction_that_lost_its_snapshot(alias: str) -> None:
    """REPEATABLE READ (PostgreSQL) or a DEFERRED transaction (SQLite): a stale save is
    refused by the database (serialization failure / SQLITE_BUSY_SNAPSHOT), not by the
    version check; retried like a conflict when the retried function opens the transaction."""
    pk = Item.objects.using(alias).create(stock=5).pk
    calls: list[int] = []

    @retry_on_conflict(attempts=3, base=0.001, cap=0.01)
    def buy() -> None:
        with transaction.atomic(using=alias):
            _snapshot_transaction(alias)
            item = Item.objects.using(alias).get(pk=pk)
            calls.append(item.version)
            if len(calls) == 1:
                in_thread(lambda: _bump(alias, pk))  # another connection commits meanwhile
            item.stock -= 1
            item.save()

    if alias == "default":
        _with_deferred_sqlite(buy)
    else:
        buy()
    assert calls == [1, 2]
    row = _row(Item, alias, pk)
    assert (row["stock"], row["version"]) == (4, 3)


def test_update_with_retry_retries_a_serialization_failure() -> None:
    """Under REPEATABLE READ (the server's default, so autocommit statements too), a
    save that waited for another transaction's row lock fails to serialize when
    that one commits."""
    require_pg()
    pk = Item.objects.using("pg").create(stock=5).pk
    locked, release = threading.Event(), threading.Event()

    def hold_the_row() -> None:
        with transaction.atomic(using="pg"):
            Item.objects.using("pg").filter(pk=pk).update(note="other", version=F("version") + 1)
            locked.set()
            release.wait(10)
            time.sleep(0.3)  # the save below is waiting for this row lock by now

    def sell() -> Item:
        repeatable = connections.create_connection("pg")
        options = {
            **repeatable.settings_dict["OPTIONS"],
            "options": r"-c default_transaction_isolation=repeatable\ read",
        }
        repeatable.settings_dict = {**repeatable.settings_dict, "OPTIONS": options}
        connections["pg"] = repeatable
        item = Item.objects.using("pg").get(pk=pk)
        holder = threading.Thread(target=lambda: in_thread(hold_the_row))
        holder.start()
        locked.wait(10)
        rounds: list[int] = []

        def take_one(item: Item) -> None:
            rounds.append(item.version)
            release.set()
            item.stock -= 1

        try:
            return update_with_retry(item, take_one, attempts=3, base=0.001, cap=0.01)
        finally:
            holder.join(10)
            assert rounds == [1, 2]

    item = in_thread(sell)
    row = _row(Item, "pg", pk)
    assert (row["stock"], row["note"], row["version"]) == (4, "other", 3)
    assert item.version == 3


def test_retries_stop_at_once_inside_an_outer_transaction(alias: str) -> None:
    pk = Item.objects.using(alias).create(stock=5).pk
    calls: list[int] = []

    @retry_on_conflict(attempts=5, base=0.001, cap=0.01)
    def buy() -> None:
        item = Item.objects.using(alias).get(pk=pk)
        calls.append(item.version)
        in_thread(lambda: _bump(alias, pk))
        item.stock -= 1
        item.save()

    def outer() -> None:
        with transaction.atomic(using=alias):
            _snapshot_transaction(alias)
            Item.objects.using(alias).get(pk=pk)  # the snapshot starts here
            buy()

    with pytest.raises(OperationalError):
        _with_deferred_sqlite(outer) if alias == "default" else outer()
    assert len(calls) == 1  # the database refused the whole transaction: no retry in it

    rounds: list[int] = []

    def take_one(item: Item) -> None:
        rounds.append(item.version)
        in_thread(lambda: _bump(alias, pk))
        item.stock -= 1

    def sell() -> None:
        with transaction.atomic(using=alias):
            _snapshot_transaction(alias)
            update_with_retry(Item.objects.using(alias).get(pk=pk), take_one, attempts=5)

    with pytest.raises(OperationalError):
        _with_deferred_sqlite(sell) if alias == "default" else sell()
    assert len(rounds) == 1


def test_retry_on_conflict_bare_and_exhaustion_raise_the_last_conflict() -> None:
    pk = Item.objects.create(stock=0).pk
    stale = Item.objects.get(pk=pk)
    _bump("default", pk)
    raised: list[VersionConflict] = []

    @retry_on_conflict
    def save_stale() -> None:
        try:
            stale.save()
        except VersionConflict as exc:
            raised.append(exc)
            raise

    with pytest.raises(VersionConflict) as info:
        save_stale()
    assert len(raised) == 5  # the default attempts
    assert info.value is raised[-1]
    assert _row(Item, "default", pk)["version"] == 2


def test_retry_on_conflict_lets_other_errors_through_at_once() -> None:
    calls: list[None] = []

    @retry_on_conflict(attempts=5)
    def fail() -> None:
        calls.append(None)
        raise ValueError("sold out")

    with pytest.raises(ValueError, match="sold out"):
        fail()
    assert len(calls) == 1


def test_retry_on_conflict_on_an_async_function() -> None:
    pk = Item.objects.create(stock=0).pk
    calls: list[int] = []

    @retry_on_conflict(attempts=3, base=0.001, cap=0.01)
    async def increment() -> int:
        item = await Item.objects.aget(pk=pk)
        calls.append(item.version)
        if len(calls) == 1:
            await sync_to_async(_bump)("default", pk)
        item.stock += 1
        await item.asave()
        return item.version

    async def main() -> int:
        try:
            return await increment()
        finally:
            await sync_to_async(connections.close_all)()

    assert asyncio.run(main()) == 3
    assert calls == [1, 2]
    assert _row(Item, "default", pk)["stock"] == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"attempts": 0}, ValueError, "attempts must be >= 1"),
        ({"attempts": 2.5}, TypeError, "attempts must be an int"),
        ({"attempts": True}, TypeError, "attempts must be an int"),
        ({"base": 0}, ValueError, "base must be > 0"),
        ({"cap": -1}, ValueError, "cap must be > 0"),
        ({"base": "1"}, TypeError, "base must be a number"),
        ({"base": 0.5, "cap": 0.1}, ValueError, "cap .* must be >= base"),
    ],
)
def test_retry_arguments_are_validated(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        retry_on_conflict(**kwargs)
    item = Item.objects.create(stock=1)
    with pytest.raises(error, match=match):
        update_with_retry(item, lambda i: setattr(i, "stock", 0), **kwargs)
    assert _row(Item, "default", item.pk)["stock"] == 1


def test_retry_on_conflict_rejects_a_non_function() -> None:
    with pytest.raises(TypeError, match="by keyword"):
        retry_on_conflict(5)  # type: ignore[call-overload]


# --- update_with_retry ----------------------------------------------------------------------


def test_update_with_retry_reloads_and_reapplies(alias: str) -> None:
    item = Item.objects.using(alias).create(stock=10)
    seen: list[int] = []

    def sell(current: Item) -> None:
        seen.append(current.stock)
        if len(seen) == 1:
            other = Item.objects.using(alias).get(pk=current.pk)
            other.stock -= 4  # someone else sells 4 meanwhile
            other.save()
        current.stock -= 1

    assert update_with_retry(item, sell, base=0.001, cap=0.01) is item
    assert seen == [10, 6]  # the second round saw the other sale
    assert (item.stock, item.version) == (5, 3)
    assert _row(Item, alias, item.pk)["stock"] == 5


def test_update_with_retry_change_error_saves_nothing(alias: str) -> None:
    item = Item.objects.using(alias).create(stock=0, note="n")

    def sell(current: Item) -> None:
        if current.stock <= 0:
            raise ValueError("sold out")
        current.stock -= 1

    with pytest.raises(ValueError, match="sold out"):
        update_with_retry(item, sell)
    row = _row(Item, alias, item.pk)
    assert (row["stock"], row["version"]) == (0, 1)


def test_update_with_retry_exhaustion_and_update_fields(alias: str) -> None:
    item = Item.objects.using(alias).create(stock=5, note="n")
    rounds: list[None] = []

    def always_overtaken(current: Item) -> None:
        rounds.append(None)
        _bump(alias, current.pk)
        current.stock -= 1

    with pytest.raises(VersionConflict) as info:
        update_with_retry(item, always_overtaken, attempts=3, base=0.001, cap=0.01)
    assert len(rounds) == 3
    assert info.value.expected_version == 3  # the last round's version
    assert _row(Item, alias, item.pk)["stock"] == 5

    item.refresh_from_db()
    item.name = "not saved"
    update_with_retry(item, lambda i: setattr(i, "note", "m"), update_fields=["note"])
    row = _row(Item, alias, item.pk)
    assert (row["note"], row["name"]) == ("m", "")


def test_update_with_retry_rejects_bad_arguments() -> None:
    plain = PlainItem.objects.create(stock=1)
    with pytest.raises(TypeError, match="OptimisticLockMixin"):
        update_with_retry(plain, lambda i: None)  # type: ignore[type-var]
    item = Item.objects.create(stock=1)
    with pytest.raises(TypeError, match="change must be a callable"):
        update_with_retry(item, "stock")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a string"):
        update_with_retry(item, lambda i: None, update_fields="stock")
    with pytest.raises(ValueError, match="do not exist in this model"):
        update_with_retry(item, lambda i: None, update_fields=["stok"])
    assert _row(Item, "default", item.pk)["version"] == 1


# --- concurrency ----------------------------------------------------------------------------


def test_threads_incrementing_with_retries_lose_no_update() -> None:
    require_pg()
    pk = Item.objects.using("pg").create(stock=0).pk
    threads_count, increments = 25, 5
    calls = [0] * threads_count
    errors: list[BaseException] = []
    start = threading.Barrier(threads_count)

    def work(index: int) -> None:
        @retry_on_conflict(attempts=500, base=0.001, cap=0.05)
        def increment() -> None:
            calls[index] += 1
            item = Item.objects.using("pg").get(pk=pk)
            item.stock += 1
            item.save()

        try:
            start.wait()
            for _ in range(increments):
                increment()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    total = threads_count * increments
    row = _row(Item, "pg", pk)
    assert (row["stock"], row["version"]) == (total, total + 1)
    assert sum(calls) > total, "no conflict happened: the retry path was not exercised"


class SoldOut(Exception):
    pass


def _sell_one(item: Item) -> None:
    if item.stock <= 0:
        raise SoldOut
    item.stock -= 1


def _buyer(alias: str, pk: Any, start: Any, out: Any) -> None:
    sold = 0
    try:
        start.wait()
        while True:
            item = Item.objects.using(alias).get(pk=pk)
            try:
                update_with_retry(item, _sell_one, attempts=1000, base=0.001, cap=0.05)
            except SoldOut:
                break
            sold += 1
        out.put(("sold", sold))
    except BaseException as exc:
        out.put(("error", repr(exc)))
    finally:
        locks.close_all()
        connections.close_all()


def test_processes_decrementing_stock_never_oversell(alias: str) -> None:
    initial, workers = 60, 6
    pk = Item.objects.using(alias).create(name="flash", stock=initial).pk
    connections.close_all()
    locks.close_all()
    start, out = FORK.Event(), FORK.Queue()
    procs = [FORK.Process(target=_buyer, args=(alias, pk, start, out)) for _ in range(workers)]
    for proc in procs:
        proc.start()
    start.set()
    results = [out.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert [kind for kind, _ in results] == ["sold"] * workers, results
    sold = sum(count for _, count in results)
    left = _row(Item, alias, pk)["stock"]
    assert left >= 0
    assert sold + left == initial
    assert left == 0  # every buyer ran until sold out


def _receivers() -> tuple[int, int]:
    """Receivers of pre_save and post_save, but the raw-save guard each optimistic
    model gets (models made by a test, with isolate_apps, get one too)."""
    guard = id(_keep_the_version_newest)
    others = [r for r in pre_save.receivers if r[0][0] != guard]
    return len(others), len(post_save.receivers)


@pytest.fixture(autouse=True)
def _no_leftover_receivers() -> Iterator[None]:
    before = _receivers()
    yield
    assert _receivers() == before
