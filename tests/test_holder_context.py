"""What a holder is doing, as @distlock records it: the request path of a view (through
Django's test client, hostile paths included), the task name of a function, a
``holder_context()`` label; stored with the lock and listed apart from the thread."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.test import Client, RequestFactory

from django_distlock import distlock, holder_context, locks
from django_distlock.context import current_context
from django_distlock.dashboard.recorder import recorder
from django_distlock.models import LockEvent

from .conftest import DATABASES

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)


def test_a_view_lists_its_request_path() -> None:
    response = Client().get("/distlock/holding/order-7")
    assert response.json() == {"contexts": ["GET /distlock/holding/order-7"]}


def test_a_hostile_path_is_cleaned_and_cut() -> None:
    """Control characters (the separator too) from a URL become '?'; 5,000 characters
    are cut to what the database column holds."""
    response = Client().get("/distlock/holding/a%1Fb%09c%00d%7F" + "é" * 5000)
    [context] = response.json()["contexts"]
    assert context.startswith("GET /distlock/holding/a?b?c?d?éé") and context.endswith("…")
    assert len(context) <= 200


def _contexts(alias: str, name: str) -> list[str]:
    return [info.context for info in locks[alias].held_locks(prefix=name)]


@pytest.mark.parametrize("alias", ["default", "locmem"])
def test_a_function_lists_its_task_name_and_a_method_its_request(alias: str, unique) -> None:
    name = unique("task")

    @distlock(name, using=alias)
    def sync_stock() -> list[str]:
        return _contexts(alias, name)

    @distlock(name, using=alias)
    async def refresh() -> list[str]:
        return await sync_to_async(_contexts)(alias, name)

    class Views:
        @distlock(name, using=alias)
        def post(self, request: object) -> list[str]:
            return _contexts(alias, name)

    here = f"{__name__}.test_a_function_lists_its_task_name_and_a_method_its_request.<locals>"
    assert sync_stock() == [f"{here}.sync_stock"]
    assert asyncio.run(refresh()) == [f"{here}.refresh"]
    request = RequestFactory().post("/shop/pay/9")
    assert Views().post(request) == ["POST /shop/pay/9"]
    assert current_context() == ""  # nothing leaks out of a call


def test_holder_context_labels_plain_locks_and_is_restored(unique) -> None:
    name = unique("label")
    with holder_context("nightly import"):
        with locks["locmem"].lock(name):
            assert _contexts("locmem", name) == ["nightly import"]
        assert current_context() == "nightly import"
    assert current_context() == ""
    with locks["locmem"].lock(name):
        assert _contexts("locmem", name) == [""]
    with pytest.raises(TypeError), holder_context(42):  # type: ignore[arg-type]
        pass


def test_the_audit_trail_records_the_context(settings, unique) -> None:
    settings.DISTLOCK = {**settings.DISTLOCK, "audited": {
        **settings.DISTLOCK["locmem"], "AUDIT": True, "KEY_PREFIX": "audited:",
    }}
    name = unique("audit")

    @distlock(name, using="audited")
    def report() -> None:
        return None

    report()
    recorder.flush()
    events = LockEvent.objects.filter(alias="audited", name=name).order_by("id")
    assert [(e.kind, e.context) for e in events] == [
        ("acquired", f"{__name__}.test_the_audit_trail_records_the_context.<locals>.report"),
        ("released", f"{__name__}.test_the_audit_trail_records_the_context.<locals>.report"),
    ]
