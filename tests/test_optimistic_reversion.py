"""Raw saves never move a version back: fixtures (``loaddata``) and django-reversion.

A raw save writes the row as a fixture or a stored revision has it, version
included; a lower version would let readers of that older version win again.
Runs on SQLite and PostgreSQL, with django-reversion installed for these tests
only (its tables are made and dropped around each test).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import reversion
from django.contrib import admin
from django.contrib.auth.models import User
from django.core import serializers
from django.db import connections
from django.test import Client, modify_settings, override_settings
from django.urls import path, reverse
from reversion.admin import VersionAdmin
from reversion.models import Revision, Version

from django_distlock.contrib.optimistic.admin import VERSION_FORM_FIELD, OptimisticAdminMixin
from django_distlock.exceptions import VersionConflict
from tests.testapp.models import Article, Place, Shop

from .conftest import DATABASES, require_pg

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]

site = admin.AdminSite(name="reversion_admin")


@admin.register(Article, site=site)
class RevertibleArticleAdmin(OptimisticAdminMixin, VersionAdmin):  # type: ignore[misc]
    fields = ["title", "status", "price"]


urlpatterns = [path("radmin/", site.urls)]


class ToPostgres:
    """Route Article to "pg" (the admin test on PostgreSQL)."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "pg" if model._meta.concrete_model is Article else None

    db_for_write = db_for_read


@pytest.fixture(params=["default", "pg"])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database with django-reversion installed and its tables made (on "default", where
    the revisions are stored and where the users they point to are)."""
    if request.param == "pg":
        require_pg()
    with modify_settings(INSTALLED_APPS={"append": "reversion"}):
        made = []
        for db in ["default"]:
            with connections[db].schema_editor() as editor:
                for model in (Revision, Version):
                    editor.create_model(model)
            made.append(db)
        try:
            yield str(request.param)
        finally:
            for db in made:
                with connections[db].schema_editor() as editor:
                    for model in (Version, Revision):
                        editor.delete_model(model)


def _row(alias: str, pk: Any) -> tuple[str, int]:
    return Article.objects.using(alias).values_list("title", "version").get(pk=pk)


def _history(alias: str) -> tuple[Article, Article, Article]:
    """Revision 1 at version 1, then version 2 (revision 2), then version 3.

    Returns the row as saved last, and two readers: at version 1 and at version 2.
    The revisions are stored in "default" (where the admin looks for them).
    """
    with reversion.create_revision(using="default"):
        article = Article.objects.using(alias).create(title="first")
    at_1 = Article.objects.using(alias).get(pk=article.pk)
    with reversion.create_revision(using="default"):
        article.title = "second"
        article.save()
    at_2 = Article.objects.using(alias).get(pk=article.pk)
    with reversion.create_revision(using="default"):
        article.title = "third"
        article.save()
    assert _row(alias, article.pk) == ("third", 3)
    return article, at_1, at_2


def test_a_revert_never_moves_the_version_back(alias: str) -> None:
    article, at_1, at_2 = _history(alias)
    first = Version.objects.get_for_object(article, model_db=alias).last()
    assert first is not None and first.field_dict["version"] == 1
    first.revision.revert()  # a raw save of the stored row: title "first", version 1
    assert _row(alias, article.pk) == ("first", 4)
    # What the admin does after a revert: save the reverted object, checked.
    reverted = Article.objects.using(alias).get(pk=article.pk)
    reverted.save()
    assert reverted.version == 5
    for stale in (at_1, at_2, article):
        stale.title = "stale"
        with pytest.raises(VersionConflict):
            stale.save()
    assert _row(alias, article.pk) == ("first", 5)


def test_a_recovered_row_never_reuses_a_version_a_reader_holds(alias: str) -> None:
    """Issue 20, item 18: deleted, recovered from any revision, edited: readers conflict."""
    article, at_1, at_2 = _history(alias)
    stored = list(Version.objects.get_for_object_reference(Article, article.pk, model_db=alias))
    assert sorted(v.field_dict["version"] for v in stored) == [1, 2, 3]
    for version in stored:
        Article.objects.using(alias).filter(pk=article.pk).delete()
        version.revert()  # django-reversion's recovery: a raw save of a new row
        recovered = Article.objects.using(alias).get(pk=article.pk)
        assert recovered.version > 3
        recovered.title = "edited"
        recovered.save()  # edited once: from a stored 1, 2 or 3 plus one, a reader's version
        for stale in (at_1, at_2, article):
            stale.title = "stale"
            with pytest.raises(VersionConflict):
                stale.save()
        assert _row(alias, article.pk) == ("edited", recovered.version)


def test_loaddata_keeps_the_newer_version_and_new_rows_start_at_the_clock(alias: str) -> None:
    article, at_1, _ = _history(alias)
    place = Place.objects.using(alias).create(name="p")
    shop = Shop.objects.using(alias).create(name="s", stock=1)
    Shop.objects.using(alias).get(pk=shop.pk).save()  # version 2 (in the parent's table)
    later = time.time_ns() // 1000 + 10**12  # a fixture's version above the clock is kept
    new_rows = [
        Place(pk=place.pk + 100, name="new", version=7),
        Place(pk=place.pk + 101, name="ahead", version=later),
    ]
    dumped = serializers.serialize("json", [at_1, *new_rows])
    before = time.time_ns() // 1000
    dumped_shop = serializers.serialize("json", [Shop.objects.using(alias).get(pk=shop.pk)])
    Shop.objects.using(alias).get(pk=shop.pk).save()  # version 3
    for text in (dumped, dumped_shop):
        for obj in serializers.deserialize("json", text):
            obj.save(using=alias)  # what loaddata does: a raw save_base()
    assert _row(alias, article.pk) == ("first", 4)  # stored 3, fixture 1
    # A new row may reuse a deleted row's key: at the clock, or its own version if higher.
    assert Place.objects.using(alias).get(pk=place.pk + 100).version >= before
    assert Place.objects.using(alias).get(pk=place.pk + 101).version == later
    # A child's raw save writes the child's table only; the parent's version stays.
    assert Shop.objects.using(alias).get(pk=shop.pk).version == 3
    at_1.title = "stale"
    with pytest.raises(VersionConflict):
        at_1.save()


@pytest.fixture
def revert_client(alias: str) -> Iterator[tuple[str, Client]]:
    user = User.objects.db_manager("default").create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(user)
    routers = [ToPostgres()] if alias == "pg" else []
    with override_settings(ROOT_URLCONF=__name__, DATABASE_ROUTERS=routers):
        yield alias, client


def test_a_revert_in_the_admin_does_not_let_a_stale_reader_win(
    revert_client: tuple[str, Client],
) -> None:
    alias, client = revert_client
    article, at_1, at_2 = _history(alias)
    first = Version.objects.get_for_object(article, model_db=alias).last()
    assert first is not None
    url = reverse("reversion_admin:testapp_article_revision", args=[article.pk, first.pk])
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert f'name="{VERSION_FORM_FIELD}"' in html
    token = html.split(f'name="{VERSION_FORM_FIELD}" value="', 1)[1].split('"', 1)[0]
    done = client.post(
        url,
        {"title": "first", "status": "draft", "price": "0", VERSION_FORM_FIELD: token},
    )
    assert done.status_code == 302, done.content.decode()[:2000]
    title, version = _row(alias, article.pk)
    assert title == "first" and version > 3
    for stale in (at_1, at_2, article):
        stale.title = "stale"
        with pytest.raises(VersionConflict):
            stale.save()
    assert _row(alias, article.pk) == ("first", version)
