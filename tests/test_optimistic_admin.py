"""The admin refuses edits and actions on rows changed by someone else since they were shown.

Everything goes through the test client, logged in as a superuser: the change
form, the ``list_editable`` changelist (with and without actions) and the
actions. SQLite runs on "default"; the PostgreSQL variants route the test
models to "pg" and make a second database connection write the row between
the admin's check and its save.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.contrib.messages import get_messages
from django.core import signing
from django.db import connections
from django.db.models.signals import pre_save
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import reverse

from django_distlock.contrib.optimistic.admin import (
    ACTION_VERSION_PREFIX,
    VERSION_FORM_FIELD,
    OptimisticAdminMixin,
    sign_version,
    unsign_version,
)
from tests.testapp.admin_models import Article, ArticleNoActions, Memo
from tests.testapp.optimistic_models import Account, Shelf

from .conftest import DATABASES, require_pg

pytestmark = pytest.mark.django_versions

TOKEN = re.compile(r'name="distlock_version" value="([^"]+)"')
ROW_PK = re.compile(r'name="form-(\d+)-id" value="([^"]+)"')
ROW_TOKEN = re.compile(r'name="form-(\d+)-distlock_version" value="([^"]+)"')
ACTION_TOKEN = re.compile(r'name="distlock_version_([^"]+)" value="([^"]+)"')


@pytest.fixture
def client(db: None) -> Client:
    user = User.objects.create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def change_url(obj: Any) -> str:
    return reverse(f"admin:testapp_{obj._meta.model_name}_change", args=[obj.pk])


def open_form(client: Client, obj: Any) -> str:
    """GET the change form; return the signed version it carries."""
    response = client.get(change_url(obj))
    assert response.status_code == 200
    found = TOKEN.findall(response.content.decode())
    assert len(found) == 1, "the change form must carry exactly one signed version"
    return found[0]


def article_post(token: str | None, **values: Any) -> dict[str, Any]:
    data = {"title": "edited", "status": "live", "price": "5", "body": "", "_save": "Save"}
    data.update({k: str(v) for k, v in values.items()})
    if token is not None:
        data[VERSION_FORM_FIELD] = token
    return data


def messages_of(response: HttpResponse) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def someone_else_sets(obj: Any, **values: Any) -> None:
    """Another user's checked save of the same row (bumps its version)."""
    other = type(obj).objects.get(pk=obj.pk)
    for name, value in values.items():
        setattr(other, name, value)
    other.save()


# -- signing --------------------------------------------------------------------


@pytest.mark.django_db
def test_sign_and_unsign_round_trip_bound_to_model_and_pk() -> None:
    a = Article.objects.create(title="a")
    b = Article.objects.create(title="b")
    token = sign_version(a, ["title"])
    read = unsign_version(Article, a.pk, token)
    assert (read.version, read.values, read.name) == (1, {"title": "a"}, "a")
    with pytest.raises(signing.BadSignature):
        unsign_version(Article, b.pk, token)
    with pytest.raises(signing.BadSignature):
        unsign_version(Memo, a.pk, token)
    with pytest.raises(signing.BadSignature):
        unsign_version(Article, a.pk, token[:-2] + ("A" if token[-1] != "A" else "B") + "x")


@pytest.mark.django_db
def test_sign_and_unsign_refuse_bad_arguments() -> None:
    a = Article.objects.create(title="a")
    with pytest.raises(TypeError, match="model instance"):
        sign_version("a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no primary key"):
        sign_version(Article(title="new"))
    with pytest.raises(ValueError, match="no concrete field 'nope'"):
        sign_version(a, ["nope"])
    with pytest.raises(TypeError, match="field names"):
        sign_version(a, [1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="model class"):
        unsign_version(a, a.pk, "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="token must be a string"):
        unsign_version(Article, a.pk, None)  # type: ignore[arg-type]


def test_check_refuses_a_model_without_version_field() -> None:
    class GroupAdmin(OptimisticAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
        pass

    errors = GroupAdmin(Group, admin.AdminSite()).check()
    assert [e.id for e in errors] == ["distlock.E201"]
    assert "Group needs exactly one VersionField" in errors[0].msg


def test_check_refuses_primary_key_in_list_editable() -> None:
    class PkAdmin(OptimisticAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
        list_display = ["title", "id"]
        list_editable = ["id"]

    errors = PkAdmin(Article, admin.AdminSite()).check()
    assert "distlock.E202" in [e.id for e in errors]
    assert "distlock.E201" not in [e.id for e in errors]


# -- change form ----------------------------------------------------------------


def test_change_form_edit_saves_and_bumps_version(client: Client) -> None:
    article = Article.objects.create(title="first", price=1)
    token = open_form(client, article)
    assert unsign_version(Article, article.pk, token).version == 1

    response = client.post(change_url(article), article_post(token, price=9))

    assert response.status_code == 302
    article.refresh_from_db()
    assert (article.title, article.price, article.version) == ("edited", 9, 2)


def test_change_form_refuses_stale_edit_naming_changed_fields(client: Client) -> None:
    article = Article.objects.create(title="first", price=1)
    token = open_form(client, article)
    someone_else_sets(article, price=7, status="live")

    response = client.post(change_url(article), article_post(token, title="mine", price=3))

    assert response.status_code == 200
    html = response.content.decode()
    assert "was changed by someone else since you opened it" in html
    assert "Unit price (now: 7)" in html
    assert "Status (now: Live)" in html
    assert "Title (now" not in html  # the title did not change
    article.refresh_from_db()
    assert (article.title, article.price, article.version) == ("first", 7, 2)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda t: None, "is missing"),
        (lambda t: "", "is missing"),
        (lambda t: t[:-1] + ("0" if t[-1] != "0" else "1"), "is invalid"),
        (lambda t: signing.Signer(salt="x").sign_object({"v": 1, "f": {}}), "is invalid"),
    ],
    ids=["absent", "empty", "altered", "foreign-salt"],
)
def test_change_form_refuses_missing_or_tampered_version(
    client: Client, mangle: Any, message: str
) -> None:
    article = Article.objects.create(title="first")
    token = open_form(client, article)

    response = client.post(change_url(article), article_post(mangle(token)))

    assert response.status_code == 200
    assert message in response.content.decode()
    article.refresh_from_db()
    assert (article.title, article.version) == ("first", 1)


def test_change_form_refuses_version_signed_for_another_row(client: Client) -> None:
    article = Article.objects.create(title="first")
    other = Article.objects.create(title="other")
    foreign = open_form(client, other)
    someone_else_sets(article, title="bumped")  # so that version 1 of 'other' would be stale
    someone_else_sets(article, title="bumped twice")

    response = client.post(change_url(article), article_post(foreign))

    assert response.status_code == 200
    assert "is invalid (altered, or from another object)" in response.content.decode()
    article.refresh_from_db()
    assert (article.title, article.version) == ("bumped twice", 3)


def test_renamed_version_field_and_explicit_fieldsets(client: Client) -> None:
    memo = Memo.objects.create(text="hello", secret="s1")
    token = open_form(client, memo)
    data = {"text": "mine", VERSION_FORM_FIELD: token, "_save": "Save"}
    someone_else_sets(memo, secret="s2")  # a field the form does not show

    # Nothing this form shows changed since it was opened: saved on top of the
    # other change, which is kept (the form's save writes the row as read now).
    saved = client.post(change_url(memo), data)

    assert saved.status_code == 302
    memo.refresh_from_db()
    assert (memo.text, memo.secret, memo.revision) == ("mine", "s2", 3)

    someone_else_sets(memo, text="theirs")
    refused = client.post(change_url(memo), {**data, "text": "mine again"})

    assert refused.status_code == 200
    memo.refresh_from_db()
    assert (memo.text, memo.revision) == ("theirs", 4)


def test_add_form_has_no_version_field(client: Client) -> None:
    response = client.get(reverse("admin:testapp_article_add"))
    assert response.status_code == 200
    assert VERSION_FORM_FIELD not in response.content.decode()
    created = client.post(reverse("admin:testapp_article_add"), article_post(None))
    assert created.status_code == 302
    assert Article.objects.get().version == 1


# -- list_editable --------------------------------------------------------------


CHANGELISTS = [
    pytest.param("admin:testapp_article_changelist", True, id="with-actions"),
    pytest.param("admin:testapp_articlenoactions_changelist", False, id="without-actions"),
]


def list_rows(client: Client, url: str) -> dict[int, tuple[int, str]]:
    """GET the changelist; return {pk: (form index, signed version)} of its rows."""
    response = client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    pks = {int(i): int(pk) for i, pk in ROW_PK.findall(html)}
    tokens = dict(ROW_TOKEN.findall(html))
    assert set(tokens) == {str(i) for i in pks}, "every row must carry its signed version"
    return {pk: (i, tokens[str(i)]) for i, pk in pks.items()}


def list_post(
    rows: dict[int, tuple[int, str]], values: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "form-TOTAL_FORMS": str(len(rows)),
        "form-INITIAL_FORMS": str(len(rows)),
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    for pk, (i, token) in rows.items():
        data[f"form-{i}-id"] = str(pk)
        data[f"form-{i}-{VERSION_FORM_FIELD}"] = token
        for name, value in values[pk].items():
            data[f"form-{i}-{name}"] = str(value)
    return data


@pytest.mark.parametrize(("url_name", "has_actions"), CHANGELISTS)
def test_list_editable_saves_fresh_rows_and_refuses_stale_ones(
    client: Client, url_name: str, has_actions: bool
) -> None:
    fresh = Article.objects.create(title="fresh", price=1)
    stale = Article.objects.create(title="stale", price=1)
    url = reverse(url_name)
    rows = list_rows(client, url)
    assert ("action-select" in client.get(url).content.decode()) is has_actions
    someone_else_sets(stale, price=50)

    edits = {fresh.pk: {"status": "live", "price": 2}, stale.pk: {"status": "live", "price": 3}}
    response = client.post(url, list_post(rows, edits))

    assert response.status_code == 200  # the list again, the stale row with the edits kept
    fresh.refresh_from_db()
    stale.refresh_from_db()
    assert (fresh.status, fresh.price, fresh.version) == ("live", 2, 2)
    assert (stale.status, stale.price, stale.version) == ("draft", 50, 2)
    notes = messages_of(response)
    assert any("1 article" in m and "changed successfully" in m for m in notes), notes
    assert any("“stale” was changed by someone else" in m and "“fresh”" not in m for m in notes), (
        notes
    )


@pytest.mark.parametrize(("url_name", "has_actions"), CHANGELISTS)
def test_list_editable_refuses_tampered_versions(
    client: Client, url_name: str, has_actions: bool
) -> None:
    a = Article.objects.create(title="a", price=1)
    b = Article.objects.create(title="b", price=1)
    url = reverse(url_name)
    rows = list_rows(client, url)
    rows[b.pk] = (rows[b.pk][0], rows[a.pk][1])  # b posts a's signed version

    response = client.post(url, list_post(rows, {a.pk: {"price": 8}, b.pk: {"price": 8}}))

    assert response.status_code == 200
    assert "is invalid (altered, or from another object)" in response.content.decode()
    assert [r.price for r in Article.objects.order_by("pk")] == [1, 1]


def test_untouched_stale_row_is_not_reported(client: Client) -> None:
    a = Article.objects.create(title="a", price=1)
    b = Article.objects.create(title="b", price=1)
    url = reverse("admin:testapp_article_changelist")
    rows = list_rows(client, url)
    someone_else_sets(b, body="changed elsewhere")  # not a column of the list

    edits = {a.pk: {"status": "draft", "price": 4}, b.pk: {"status": "draft", "price": 1}}
    response = client.post(url, list_post(rows, edits))

    assert response.status_code == 302
    assert not any("Not saved" in m for m in messages_of(response))
    b.refresh_from_db()
    assert (b.body, b.version) == ("changed elsewhere", 2)
    assert Article.objects.get(pk=a.pk).price == 4


# -- actions --------------------------------------------------------------------


def action_tokens(client: Client) -> dict[str, str]:
    response = client.get(reverse("admin:testapp_article_changelist"))
    return dict(ACTION_TOKEN.findall(response.content.decode()))


def action_post(action: str, tokens: dict[str, str], pks: list[int]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "action": action,
        "index": "0",
        "_selected_action": [str(p) for p in pks],
    }
    data.update({f"{ACTION_VERSION_PREFIX}{pk}": token for pk, token in tokens.items()})
    return data


def test_action_runs_on_fresh_selection(client: Client) -> None:
    a = Article.objects.create(title="a")
    b = Article.objects.create(title="b")
    tokens = action_tokens(client)
    assert set(tokens) == {str(a.pk), str(b.pk)}

    url = reverse("admin:testapp_article_changelist")
    response = client.post(url, action_post("mark_live", tokens, [a.pk, b.pk]))

    assert response.status_code == 302
    assert set(Article.objects.values_list("status", flat=True)) == {"live"}


def test_action_refused_when_a_selected_row_changed(client: Client) -> None:
    a = Article.objects.create(title="a")
    b = Article.objects.create(title="b")
    tokens = action_tokens(client)
    someone_else_sets(b, title="b2")

    url = reverse("admin:testapp_article_changelist")
    response = client.post(url, action_post("mark_live", tokens, [a.pk, b.pk]))

    assert response.status_code == 302
    assert set(Article.objects.values_list("status", flat=True)) == {"draft"}
    notes = messages_of(response)
    assert any("not run" in m and "“b2”" in m and "“a”" not in m for m in notes), notes


def test_action_refused_without_or_with_foreign_versions(client: Client) -> None:
    a = Article.objects.create(title="a")
    b = Article.objects.create(title="b")
    tokens = action_tokens(client)
    url = reverse("admin:testapp_article_changelist")

    swapped = {str(a.pk): tokens[str(b.pk)], str(b.pk): tokens[str(a.pk)]}
    for bad in ({}, swapped):
        response = client.post(url, action_post("mark_live", bad, [a.pk, b.pk]))
        assert response.status_code == 302
        assert any("missing or invalid" in m for m in messages_of(response))
    assert set(Article.objects.values_list("status", flat=True)) == {"draft"}


def test_action_refused_when_a_selected_row_was_deleted(client: Client) -> None:
    a = Article.objects.create(title="a")
    b = Article.objects.create(title="b")
    tokens = action_tokens(client)
    Article.objects.filter(pk=b.pk).delete()

    url = reverse("admin:testapp_article_changelist")
    response = client.post(url, action_post("mark_live", tokens, [a.pk, b.pk]))

    assert response.status_code == 302
    assert Article.objects.get(pk=a.pk).status == "draft"
    assert any("someone else deleted “b”" in m for m in messages_of(response))


def test_delete_selected_refused_when_stale_at_selection(client: Client) -> None:
    a = Article.objects.create(title="a")
    tokens = action_tokens(client)
    someone_else_sets(a, price=3)

    url = reverse("admin:testapp_article_changelist")
    response = client.post(url, action_post("delete_selected", tokens, [a.pk]))

    assert response.status_code == 302
    assert Article.objects.filter(pk=a.pk).exists()


def test_delete_selected_confirmation_checks_versions_again(client: Client) -> None:
    a = Article.objects.create(title="a")
    b = Article.objects.create(title="b")
    url = reverse("admin:testapp_article_changelist")
    confirm = {"action": "delete_selected", "post": "yes", "_selected_action": [str(a.pk)]}

    page = client.post(url, action_post("delete_selected", action_tokens(client), [a.pk]))
    assert page.status_code == 200 and "Are you sure" in page.content.decode()
    someone_else_sets(a, price=3)  # between the confirmation page and "Yes, I'm sure"
    refused = client.post(url, confirm)
    assert refused.status_code == 302
    assert any("not run" in m for m in messages_of(refused))
    assert Article.objects.filter(pk=a.pk).exists()

    page = client.post(url, action_post("delete_selected", action_tokens(client), [a.pk]))
    assert page.status_code == 200
    done = client.post(url, confirm)
    assert done.status_code == 302
    assert list(Article.objects.values_list("pk", flat=True)) == [b.pk]

    # A confirmation for rows that were never checked (nothing remembered) is refused.
    forged = client.post(url, {**confirm, "_selected_action": [str(b.pk)]})
    assert forged.status_code == 302
    assert Article.objects.filter(pk=b.pk).exists()


# -- PostgreSQL: the admin on "pg", a second connection racing the save ----------


class ToPostgres:
    """Route the admin test models to the "pg" database."""

    def _route(self, model: Any, **hints: Any) -> str | None:
        routed = model._meta.concrete_model in (Article, Memo) or model._meta.app_label == "shop"
        return "pg" if routed else None

    db_for_read = db_for_write = _route


@pytest.fixture
def pg_client(transactional_db: None) -> Iterator[Client]:
    require_pg()
    user = User.objects.create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(user)
    with override_settings(DATABASE_ROUTERS=[ToPostgres()]):
        yield client


@pytest.fixture
def race() -> Iterator[dict[str, Any]]:
    """Just before the admin saves row ``pk``, another connection writes it (once)."""
    plan: dict[str, Any] = {"pk": None, "fired": 0}

    def write_from_elsewhere(sender: Any, instance: Any, **kwargs: Any) -> None:
        if plan["pk"] is None or instance.pk != plan["pk"] or plan["fired"]:
            return
        plan["fired"] += 1
        other = connections.create_connection("pg")  # its own session, autocommit
        try:
            with other.cursor() as cursor:
                table = other.ops.quote_name(Article._meta.db_table)
                cursor.execute(
                    f"UPDATE {table} SET price = 99, version = version + 1 WHERE id = %s",
                    [instance.pk],
                )
        finally:
            other.close()

    pre_save.connect(write_from_elsewhere, sender=Article)
    pre_save.connect(write_from_elsewhere, sender=ArticleNoActions)
    yield plan
    pre_save.disconnect(write_from_elsewhere, sender=Article)
    pre_save.disconnect(write_from_elsewhere, sender=ArticleNoActions)


PG = pytest.mark.django_db(databases=["default", "pg"], transaction=True)


@PG
def test_pg_change_form_stale_edit_refused(pg_client: Client) -> None:
    article = Article.objects.using("pg").create(title="first", price=1)
    token = open_form(pg_client, article)
    Article.objects.using("pg").filter(pk=article.pk).update(price=7, version=2)

    response = pg_client.post(change_url(article), article_post(token))

    assert response.status_code == 200
    assert "Unit price (now: 7)" in response.content.decode()
    article = Article.objects.using("pg").get(pk=article.pk)
    assert (article.title, article.version) == ("first", 2)
    assert not Article.objects.using("default").exists()


@PG
def test_pg_change_form_race_in_save_is_a_form_error(
    pg_client: Client, race: dict[str, Any]
) -> None:
    article = Article.objects.using("pg").create(title="first", price=1)
    token = open_form(pg_client, article)
    race["pk"] = article.pk

    response = pg_client.post(change_url(article), article_post(token, title="mine", price=3))

    assert race["fired"] == 1
    assert response.status_code == 200
    html = response.content.decode()
    assert "was changed by someone else since you opened it" in html
    assert "Unit price (now: 99)" in html
    article = Article.objects.using("pg").get(pk=article.pk)
    assert (article.title, article.price, article.version) == ("first", 99, 2)


@PG
@pytest.mark.parametrize(("url_name", "has_actions"), CHANGELISTS)
def test_pg_list_editable_race_in_save(
    pg_client: Client, race: dict[str, Any], url_name: str, has_actions: bool
) -> None:
    first = Article.objects.using("pg").create(title="first", price=1)
    second = Article.objects.using("pg").create(title="second", price=1)
    url = reverse(url_name)
    rows = list_rows(pg_client, url)
    race["pk"] = first.pk  # the list is ordered by -pk: 'second' is saved before 'first'

    edits = {first.pk: {"status": "live", "price": 2}, second.pk: {"status": "live", "price": 3}}
    response = pg_client.post(url, list_post(rows, edits))

    assert race["fired"] == 1
    assert response.status_code == 200
    first = Article.objects.using("pg").get(pk=first.pk)
    second = Article.objects.using("pg").get(pk=second.pk)
    assert (first.status, first.price, first.version) == ("draft", 99, 2)
    assert (second.status, second.price, second.version) == ("live", 3, 2)  # saved once
    notes = messages_of(response)
    assert any("“first” was changed by someone else" in m for m in notes), notes


@PG
def test_pg_actions_check_locked_rows(pg_client: Client) -> None:
    a = Article.objects.using("pg").create(title="a")
    b = Article.objects.using("pg").create(title="b")
    url = reverse("admin:testapp_article_changelist")
    tokens = action_tokens(pg_client)
    Article.objects.using("pg").filter(pk=b.pk).update(title="b2", version=2)

    refused = pg_client.post(url, action_post("mark_live", tokens, [a.pk, b.pk]))
    assert refused.status_code == 302
    assert any("not run" in m and "“b2”" in m for m in messages_of(refused))
    assert set(Article.objects.using("pg").values_list("status", flat=True)) == {"draft"}

    tokens = action_tokens(pg_client)
    page = pg_client.post(url, action_post("delete_selected", tokens, [a.pk, b.pk]))
    assert page.status_code == 200 and "Are you sure" in page.content.decode()
    confirm = {"action": "delete_selected", "post": "yes", "_selected_action": [a.pk, b.pk]}
    done = pg_client.post(url, confirm)
    assert done.status_code == 302
    assert not Article.objects.using("pg").exists()


# -- as editors meet it: no-op saves, merges, deleted rows, wording (issue 14, item 6) --


FORM_VALUE = r'name="{name}"[^>]*value="([^"]*)"'
BOTH = pytest.mark.django_db(databases=DATABASES, transaction=True)


@pytest.fixture(params=["default", "pg"])
def editor(request: pytest.FixtureRequest) -> Iterator[Client]:
    """A logged-in client, the test models on SQLite or (routed) on PostgreSQL."""
    if request.param == "pg":
        require_pg()
    user = User.objects.create_superuser("editor", "editor@example.com", "pw")
    client = Client()
    client.force_login(user)
    routers = [ToPostgres()] if request.param == "pg" else []
    with override_settings(DATABASE_ROUTERS=routers):
        yield client


def field_value(html: str, name: str) -> str:
    found = re.findall(FORM_VALUE.format(name=re.escape(name)), html)
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


@BOTH
def test_a_save_that_changed_nothing_writes_nothing(editor: Client) -> None:
    article = Article.objects.create(title="first", price=1)
    mine, theirs = open_form(editor, article), open_form(editor, article)

    unchanged = editor.post(
        change_url(article), article_post(mine, title="first", price=1, status="draft")
    )

    assert unchanged.status_code == 302
    article.refresh_from_db()
    assert article.version == 1  # no new version: nobody else is refused for nothing
    saved = editor.post(change_url(article), article_post(theirs, price=2))
    assert saved.status_code == 302
    article.refresh_from_db()
    assert (article.title, article.price, article.version) == ("edited", 2, 2)


@BOTH
def test_a_stale_form_comes_back_merged_with_theirs_beside_mine(editor: Client) -> None:
    article = Article.objects.create(title="first", price=1, body="old body")
    token = open_form(editor, article)
    someone_else_sets(article, price=7, body="their body")  # price is on the form, body too

    posted = article_post(token, title="mine", price=3, status="draft", body="old body")
    response = editor.post(change_url(article), posted)

    assert response.status_code == 200
    html = response.content.decode()
    assert "Please correct" not in html and "errornote" not in html
    notes = messages_of(response)
    assert any(
        "changed by someone else since you opened it, so nothing was saved yet" in m
        and "Unit price (now: 7)" in m
        and "Body (now: their body)" in m
        and "(Unit price), yours is in the box and theirs beside it" in m
        for m in notes
    ), notes
    assert field_value(html, "title") == "mine"  # my change, which they did not touch
    assert field_value(html, "price") == "3"  # mine, where we both changed it...
    assert "theirs: <strong>7</strong>" in html  # ...and theirs beside it
    assert "their body</textarea>" in html  # theirs, which I did not touch
    article.refresh_from_db()
    assert (article.title, article.price, article.version) == ("first", 7, 2)

    # The page re-sent as it was (a reload): the same merge again, nothing saved.
    again = editor.post(change_url(article), posted)
    assert again.status_code == 200 and field_value(again.content.decode(), "price") == "3"

    # Saving the merged form as shown: mine where I changed, theirs elsewhere.
    merged = {
        **posted,
        "body": "their body",
        VERSION_FORM_FIELD: field_value(html, VERSION_FORM_FIELD),
    }
    saved = editor.post(change_url(article), merged)
    assert saved.status_code == 302
    article.refresh_from_db()
    assert (article.title, article.price, article.body, article.version) == (
        "mine",
        3,
        "their body",
        3,
    )


@BOTH
def test_a_stale_form_whose_changes_match_theirs_saves_nothing(editor: Client) -> None:
    article = Article.objects.create(title="first", price=1)
    token = open_form(editor, article)
    someone_else_sets(article, price=5)

    response = editor.post(
        change_url(article), article_post(token, title="first", price=5, status="draft")
    )

    assert response.status_code == 302
    article.refresh_from_db()
    assert (article.price, article.version) == (5, 2)


@BOTH
def test_the_list_keeps_a_stale_rows_edits_merged(editor: Client) -> None:
    a = Article.objects.create(title="a", price=1)
    b = Article.objects.create(title="b", price=1)
    url = reverse("admin:testapp_article_changelist")
    rows = list_rows(editor, url)
    someone_else_sets(b, price=50, status="live")

    edits = {a.pk: {"status": "live", "price": 2}, b.pk: {"status": "draft", "price": 3}}
    response = editor.post(url, list_post(rows, edits))

    assert response.status_code == 200
    html = response.content.decode()
    index = {pk: i for pk, (i, _) in list_rows(editor, url).items()}
    assert field_value(html, f"form-{index[b.pk]}-price") == "3"  # mine, kept
    assert "theirs: <strong>50</strong>" in html
    notes = messages_of(response)
    assert any(
        "“b” was changed by someone else since the list was shown, so your changes to it "
        "were not saved yet"
        in m
        and "(b: Unit price)" in m
        for m in notes
    ), notes
    assert not any("Reload" in m for m in notes)
    b.refresh_from_db()
    assert (b.price, b.status, b.version) == (50, "live", 2)
    # Saving the list as shown now.
    shown = {
        pk: (i, field_value(html, f"form-{i}-{VERSION_FORM_FIELD}")) for pk, (i, _) in rows.items()
    }
    again = {a.pk: {"status": "live", "price": 2}, b.pk: {"status": "live", "price": 3}}
    saved = editor.post(url, list_post(shown, again))
    assert saved.status_code == 302
    b.refresh_from_db()
    assert (b.price, b.status, b.version) == (3, "live", 3)


@BOTH
def test_a_row_deleted_meanwhile_does_not_stop_the_others(editor: Client) -> None:
    a = Article.objects.create(title="a", price=1)
    b = Article.objects.create(title="Blue mug", price=1)
    c = Article.objects.create(title="c", price=1)
    url = reverse("admin:testapp_article_changelist")
    rows = list_rows(editor, url)
    Article.objects.filter(pk=b.pk).delete()

    edits = {pk: {"status": "live", "price": 9} for pk in (a.pk, b.pk, c.pk)}
    response = editor.post(url, list_post(rows, edits))

    assert response.status_code == 302
    assert sorted(Article.objects.values_list("title", "price")) == [("a", 9), ("c", 9)]
    notes = messages_of(response)
    assert any(
        m == "“Blue mug” was deleted by someone else since the list was shown; your changes "
        "to it were not saved."
        for m in notes
    ), notes
    assert any("2 articles were changed successfully" in m for m in notes), notes


@BOTH
def test_a_list_shown_again_with_errors_pairs_rows_with_their_forms(editor: Client) -> None:
    a = Article.objects.create(title="a", price=1)
    b = Article.objects.create(title="b", price=1)
    url = reverse("admin:testapp_article_changelist")
    rows = list_rows(editor, url)
    Article.objects.create(title="c, added meanwhile")  # first in the list now (by -pk)

    edits = {a.pk: {"status": "live", "price": 4}, b.pk: {"status": "live", "price": "x"}}
    response = editor.post(url, list_post(rows, edits))

    assert response.status_code == 200  # b's price is invalid: nothing saved, errors shown
    body = response.content.decode().split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    by_row = {
        re.search(r"<th[^>]*>.*?>([^<]+)</a>", tr).group(1): tr  # type: ignore[union-attr]
        for tr in body.split("<tr")[1:]
    }
    assert set(by_row) == {"a", "b"}
    assert 'value="x"' in by_row["b"] and 'value="4"' in by_row["a"]


@BOTH
def test_select_all_checks_every_row_shown_and_counts_those_not(
    editor: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = Article.objects.create(title="a")
    b = Article.objects.create(title="b")
    url = reverse("admin:testapp_article_changelist")
    tokens = action_tokens(editor)
    someone_else_sets(a, title="a2")  # shown, not ticked

    across = {**action_post("mark_live", tokens, [b.pk]), "select_across": "1"}
    refused = editor.post(url, across)

    assert refused.status_code == 302
    assert set(Article.objects.values_list("status", flat=True)) == {"draft"}
    assert any("not run" in m and "“a2”" in m for m in messages_of(refused))

    monkeypatch.setattr(admin.site._registry[Article], "list_per_page", 1)
    tokens = action_tokens(editor)  # the first page shows one row of two
    assert len(tokens) == 1
    done = editor.post(
        url, {**action_post("mark_live", tokens, list(map(int, tokens))), "select_across": "1"}
    )
    assert done.status_code == 302
    assert set(Article.objects.values_list("status", flat=True)) == {"live"}
    notes = messages_of(done)
    assert any("also covered 1 article that this page did not show" in m for m in notes), notes


@BOTH
def test_select_all_on_an_annotated_changelist(editor: Client) -> None:
    """The shop's product admin annotates its queryset (GROUP BY): locking it must not fail."""
    from testproject.shop.models import Product

    Product.objects.create(name="mug", stock=1)
    Product.objects.create(name="cup", stock=1)
    url = reverse("admin:shop_product_changelist")
    tokens = dict(ACTION_TOKEN.findall(editor.get(url).content.decode()))
    assert len(tokens) == 2
    post = {
        **action_post("delete_selected", tokens, [int(next(iter(tokens)))]),
        "select_across": "1",
    }
    page = editor.post(url, post)
    assert page.status_code == 200 and "Are you sure" in page.content.decode()
    done = editor.post(
        url, {"action": "delete_selected", "post": "yes", "_selected_action": list(tokens)}
    )
    assert done.status_code == 302
    assert not Product.objects.exists()


# -- NULL when the page opened is not the editor's change (issue 20, item 17) ----------


NULLABLE = ["username", "limit", "amount", "ratio", "ref", "address", "shelf"]


def account_values(name: str, whose: str) -> tuple[str, Any, str]:
    """(attname, value to store, value as posted) of ``name``, theirs or mine."""
    if name == "shelf":
        shelf = Shelf.objects.create(label=whose)
        return "shelf_id", shelf.pk, str(shelf.pk)
    value = {
        "username": {"theirs": "bob", "mine": "alice"},
        "limit": {"theirs": 5, "mine": 6},
        "amount": {"theirs": Decimal("1.50"), "mine": Decimal("2.25")},
        "ratio": {"theirs": 0.5, "mine": 0.25},
        "ref": {"theirs": uuid.UUID(int=1), "mine": uuid.UUID(int=2)},
        "address": {"theirs": "10.0.0.1", "mine": "10.0.0.2"},
    }[name][whose]
    return name, value, str(value)


def account_post(token: str | None, **values: Any) -> dict[str, Any]:
    """A change form post of every Account field as it opens on a row of NULLs, count 0."""
    data: dict[str, Any] = {name: "" for name in NULLABLE}
    data.update({"count": "0", "_save": "Save"})
    data.update({k: str(v) for k, v in values.items()})
    if token is not None:
        data[VERSION_FORM_FIELD] = token
    return data


def shown(response: Any, name: str) -> str:
    """The value the form of the page shows in the input of ``name``."""
    return str(response.context["adminform"].form[name].value())


@pytest.mark.django_db
@pytest.mark.parametrize("name", NULLABLE)
def test_a_field_null_when_opened_and_set_by_another_is_theirs_not_a_clash(
    client: Client, name: str
) -> None:
    account = Account.objects.create()
    token = open_form(client, account)
    attname, theirs, posted = account_values(name, "theirs")
    someone_else_sets(account, **{attname: theirs})

    response = client.post(change_url(account), account_post(token, count=7))

    # The other changed a field of the form: shown merged, their value in the box.
    assert response.status_code == 200
    notes = messages_of(response)
    assert any("nothing was saved yet" in m for m in notes), notes
    assert not any("yours is in the box" in m for m in notes), notes
    assert "theirs: <strong>" not in response.content.decode()
    assert (shown(response, name), shown(response, "count")) == (posted, "7")
    saved = client.post(
        change_url(account),
        account_post(TOKEN.findall(response.content.decode())[0], count=7, **{name: posted}),
    )
    assert saved.status_code == 302
    account.refresh_from_db()
    assert (account.count, getattr(account, attname), account.version) == (7, theirs, 3)


@pytest.mark.django_db
@pytest.mark.parametrize("name", NULLABLE)
def test_a_field_null_when_opened_and_set_by_both_is_still_a_clash(
    client: Client, name: str
) -> None:
    account = Account.objects.create()
    token = open_form(client, account)
    attname, theirs, _ = account_values(name, "theirs")
    someone_else_sets(account, **{attname: theirs})
    _, _, mine = account_values(name, "mine")

    response = client.post(change_url(account), account_post(token, **{name: mine}))

    assert response.status_code == 200
    notes = messages_of(response)
    assert any("yours is in the box and theirs beside it" in m for m in notes), notes
    assert shown(response, name) == mine
    assert "theirs: <strong>" in response.content.decode()
    account.refresh_from_db()
    assert (getattr(account, attname), account.version) == (theirs, 2)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("opened", "theirs", "posted"),
    [("None", None, "None"), (None, "None", ""), ("", "None", "")],
    ids=["text-None-then-null", "null-then-text-None", "empty-then-text-None"],
)
def test_null_the_text_none_and_empty_are_three_values(
    client: Client, opened: str | None, theirs: str | None, posted: str
) -> None:
    account = Account.objects.create(username=opened)
    token = open_form(client, account)
    someone_else_sets(account, username=theirs)

    response = client.post(change_url(account), account_post(token, count=7, username=posted))

    assert response.status_code == 200  # shown merged, not saved over their change
    assert not any("yours is in the box" in m for m in messages_of(response))
    account.refresh_from_db()
    assert (account.username, account.count, account.version) == (theirs, 0, 2)


@pytest.mark.parametrize("name", NULLABLE)
def test_the_list_does_not_report_an_untouched_row_whose_null_another_set(
    client: Client, name: str
) -> None:
    a = Account.objects.create()
    b = Account.objects.create()
    url = reverse("admin:testapp_account_changelist")
    rows = list_rows(client, url)
    attname, theirs, _ = account_values(name, "theirs")
    someone_else_sets(b, **{attname: theirs})

    as_shown = {n: "" for n in NULLABLE}
    response = client.post(
        url, list_post(rows, {a.pk: {**as_shown, "count": 3}, b.pk: {**as_shown, "count": 0}})
    )

    assert response.status_code == 302, messages_of(response)
    assert not any("changed by someone else" in m for m in messages_of(response))
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.count, a.version) == (3, 2)
    assert (getattr(b, attname), b.version) == (theirs, 2)


@pytest.mark.django_db
def test_a_form_signed_before_the_null_encoding_still_works(client: Client) -> None:
    """A page opened before an upgrade carries value_to_string()'s "None" for NULL."""
    account = Account.objects.create(username="None")
    old = {n: Account._meta.get_field(n).value_to_string(account) for n in NULLABLE}
    old["count"] = "0"
    salt = f"django_distlock.optimistic_admin:testapp.account:{account.pk}"
    token = signing.Signer(salt=salt).sign_object(
        {"v": 1, "f": old, "n": str(account)}, compress=True
    )
    someone_else_sets(account, limit=5)  # "None": certainly NULL for a number

    response = client.post(change_url(account), account_post(token, count=7, username="None"))

    assert response.status_code == 200
    assert not any("yours is in the box" in m for m in messages_of(response))
    assert (shown(response, "limit"), shown(response, "count")) == ("5", "7")
    # "None" of a text field is NULL or the text: where the post is not the row's value
    # now, the field is shown as theirs, never saved over it.
    someone_else_sets(account, username=None)
    again = client.post(change_url(account), account_post(token, count=7, username="None"))
    assert again.status_code == 200
    account.refresh_from_db()
    assert (account.username, account.limit, account.count) == (None, 5, 0)
