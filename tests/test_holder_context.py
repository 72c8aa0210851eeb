"""What a holder is doing, as @distlock records it: the request path of a view (through
Django's test client, hostile paths included), the task name of a function, a
``holder_context()`` label; stored with the lock and listed apart from the thread."""

from __future__ import annotations

import asyncio
import threading

# Imported now, with every app installed: this module's tests restrict the app registry
# to the library's apps (LIBRARY_DB), and the test client's first request imports the
# auth middleware, whose import asks the registry for the user model. Run alone, the
# module failed there ("No installed app with label 'auth'"); in a full run some earlier
# module had imported it.
import django.contrib.auth.middleware  # noqa: F401
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.test import Client, RequestFactory

from django_distlock import distlock, holder_context, locks
from django_distlock.context import current_context
from django_distlock.contrib.audit.models import LockEvent
from django_distlock.contrib.audit.recorder import recorder

from .conftest import LIBRARY_DB, eventually, needs_pg, require_pg

pytestmark = [
    pytest.mark.django_versions,
    LIBRARY_DB,
]


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


#: Aliases whose listing keeps only the start of a long context, and why.
CUT = {"pg-session": "PostgreSQL keeps 63 bytes of a session's application_name, the "
       "holder's label (docs/database.md, session mode)",
       "mysql-session": "the holder's label, as on PostgreSQL (one format, 63 bytes, for "
       "both vendors' listings)"}


def _as_listed(alias: str, context: str, full: str) -> bool:
    """Whether ``context`` is ``full`` as ``alias`` lists it: whole, or (``CUT``) its
    start and an ellipsis."""
    if alias in CUT and context != full:
        return len(context) > 1 and context.endswith("…") and full.startswith(context[:-1])
    return context == full


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
    assert [(e.kind, e.context) for e in events] == [  # one row per hold
        ("released", f"{__name__}.test_the_audit_trail_records_the_context.<locals>.report"),
    ]


def _listing_cases() -> list[tuple[str, str]]:
    """(alias, kind) for every alias of the test settings that lists its locks: exclusive,
    and read locks and semaphores where the alias has them."""
    cases = []
    for alias in settings.DISTLOCK:
        backend = locks[alias]
        if not backend.supports_listing:
            continue
        cases.append((alias, "exclusive"))
        if backend.supports_read_write:
            cases.append((alias, "read"))
        if backend.supports_semaphore:
            cases.append((alias, "semaphore"))
    return cases


@pytest.mark.parametrize(("alias", "kind"), _listing_cases())
def test_every_listing_alias_lists_a_views_path_and_a_tasks_name(
    alias: str, kind: str, unique
) -> None:
    """Through the test client, a ``@distlock`` view's lock is listed (from inside the
    view, while held) with its request, hostile characters cleaned; a decorated function's
    with its task name; a plain ``with lock()`` with no context."""
    if needs_pg(alias):
        require_pg()
    name = unique(f"ctx-{kind}").replace(":", "-")
    path = f"/distlock/holding-on/{alias}/{kind}/{name}/a%1Fb%09c"
    held = Client().get(path).json()["held"]
    expected = "GET " + path.replace("%1F", "?").replace("%09", "?")
    mine = [(host, context) for lock, host, context in held if lock.startswith(f"ctx:{name}/")]
    assert len(mine) == 1
    # A transaction-mode holder's row is written in its open transaction: listings (other
    # connections) cannot see who holds it, its context neither.
    hidden = alias.endswith("-tx")
    host, context = mine[0]
    if hidden:
        assert (host, context) == ("", "")
    else:
        assert host and _as_listed(alias, context, expected), (context, expected)
    limit = 2 if kind == "semaphore" else None

    @distlock(f"ctx:{name}/task", using=alias, kind=kind, limit=limit)
    def nightly() -> list[str]:
        return _contexts(alias, f"ctx:{name}/task")

    task = f"{__name__}.{test_every_listing_alias_lists_a_views_path_and_a_tasks_name.__name__}"
    listed = nightly()
    if hidden:
        assert listed == [""]
    else:
        assert len(listed) == 1 and _as_listed(alias, listed[0], f"{task}.<locals>.nightly")
    with locks[alias].lock(f"ctx:{name}/plain"):
        assert _contexts(alias, f"ctx:{name}/plain") == [""]


@pytest.mark.parametrize(
    "alias",
    # Transaction mode lists no holders (see above).
    [a for a, kind in _listing_cases() if kind == "exclusive" and not a.endswith("-tx")],
)
def test_a_waiter_granted_on_release_lists_its_own_context(alias: str, unique) -> None:
    """A waiter granted when the holder releases (PostgreSQL's hand-off row, Redis'
    queue, ZooKeeper's predecessor watch) is listed with the context it waited with."""
    if needs_pg(alias):
        require_pg()
    name = unique("handoff")
    first = locks[alias].lock(name, ttl=30)
    with holder_context("GET /first"):
        first.acquire()
    listed: list[str] = []

    def waiter() -> None:
        with holder_context("task second"), locks[alias].lock(name, ttl=30, timeout=10):
            listed.extend(_contexts(alias, name))
        close_old_connections()

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        # Release once the waiter waits (backends that count waiters show it; the others
        # had two seconds to reach their wait).
        if not eventually(lambda: any(i.waiters for i in locks[alias].held_locks(prefix=name)), 2):
            assert thread.is_alive()
    finally:
        first.release()
        thread.join(15)
    assert listed == ["task second"]
