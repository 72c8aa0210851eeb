"""Fenced writes on SQLite and PostgreSQL, with tokens from the database backend.

The last test is the one fencing exists for: a holder paused (SIGSTOP) past
its lease comes back after a newer holder wrote, and its write is refused.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, IntegrityError, connections
from django.db.models import F
from django.db.models.signals import post_save, pre_save
from django.test.utils import CaptureQueriesContext

from django_distlock import Lock, locks
from django_distlock.contrib.optimistic.fencing import (
    FencedQuerySet,
    FencingTokenField,
    fenced_save,
    fencing_field,
)
from django_distlock.exceptions import (
    DistLockError,
    LockLost,
    LockNotHeld,
    StaleFencingToken,
    UnsupportedOperation,
    VersionConflict,
)
from tests.testapp.models import (
    DoublyFenced,
    FencedDepot,
    FencedItem,
    FencedItemProxy,
    FencedShop,
    RenamedFenceItem,
    VersionedFencedItem,
    VersionedFencedShop,
)

from .conftest import DATABASES, in_thread, require_pg

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]
FORK = multiprocessing.get_context("fork")
SETUPS = {"sqlite": ("sqlite-lease", "default"), "pg": ("pg-lease", "pg")}


@pytest.fixture(params=sorted(SETUPS))
def setup(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(lock alias, database alias) of one database; the locks live in the same one."""
    if request.param == "pg":
        require_pg()
    return SETUPS[request.param]


@pytest.fixture
def db(setup: tuple[str, str]) -> str:
    return setup[1]


@pytest.fixture
def grant(setup: tuple[str, str], unique: Callable[..., str]) -> Iterator[Callable[[], Lock]]:
    """Return a function that acquires the next grant of one key (the previous is released)."""
    name = unique("fence")
    held: list[Lock] = []

    def next_grant(ttl: float = 30) -> Lock:
        if held and held[-1].held:
            held[-1].release()
        lease = locks[setup[0]].lock(name, ttl=ttl)
        assert lease.acquire(timeout=10)
        held.append(lease)
        return lease

    yield next_grant
    for lease in held:
        if lease.held:
            lease.release()


def item(db: str, **values: Any) -> FencedItem:
    """Insert a row with a plain save: its token is NULL."""
    return FencedItem.objects.using(db).create(label=values.pop("label", "init"), **values)


def row(db: str, pk: Any, model: Any = FencedItem) -> dict[str, Any]:
    return model.objects.using(db).values().get(pk=pk)


# -- fenced_save --------------------------------------------------------------


def test_increasing_tokens_are_accepted(db: str, grant: Callable[[], Lock]) -> None:
    obj = item(db)
    first = grant()
    obj.label = "first"
    obj.fenced_save(first, using=db)
    assert obj.fencing_token == first.fencing_token
    assert row(db, obj.pk)["label"] == "first"
    assert row(db, obj.pk)["fencing_token"] == first.fencing_token
    second = grant()
    assert second.fencing_token > first.fencing_token
    obj.label = "second"
    obj.fenced_save(second, using=db)
    assert row(db, obj.pk)["label"] == "second"
    assert row(db, obj.pk)["fencing_token"] == second.fencing_token


def test_lower_token_is_refused_and_nothing_changes(db: str, grant: Callable[[], Lock]) -> None:
    stale = grant().fencing_token
    newer = grant()
    obj = item(db, stock=5)
    obj.label = "newer"
    obj.fenced_save(newer, using=db)
    before = row(db, obj.pk)
    late = FencedItem.objects.using(db).get(pk=obj.pk)
    late.label, late.stock = "stale", 0
    with pytest.raises(StaleFencingToken) as info:
        late.fenced_save(stale, using=db)
    assert row(db, obj.pk) == before  # label, stock, token and auto_now timestamp
    assert info.value.token == stale and info.value.instance is late
    assert late.fencing_token == newer.fencing_token  # as read; not set on refusal
    message = str(info.value)
    assert f"pk={obj.pk}" in message and f"token {stale} refused" in message
    assert f"carries token {newer.fencing_token}" in message and "newer lock holder" in message


def test_equal_token_is_accepted(db: str, grant: Callable[[], Lock]) -> None:
    lease = grant()
    obj = item(db)
    for label in ("once", "twice"):
        obj.label = label
        obj.fenced_save(lease, using=db)
    assert row(db, obj.pk)["label"] == "twice"
    assert row(db, obj.pk)["fencing_token"] == lease.fencing_token


@pytest.mark.parametrize("token", [0, 1, 2**63 - 1])
def test_a_row_never_fenced_accepts_any_token(db: str, token: int) -> None:
    obj = item(db)
    assert row(db, obj.pk)["fencing_token"] is None
    obj.label = "fenced"
    obj.fenced_save(token, using=db)
    assert row(db, obj.pk)["fencing_token"] == token


def test_update_fields_writes_only_those_and_the_token(db: str) -> None:
    obj = item(db, stock=5)
    obj.label, obj.stock = "changed", 99
    obj.fenced_save(7, update_fields=["stock"], using=db)
    assert row(db, obj.pk)["label"] == "init"
    assert row(db, obj.pk)["stock"] == 99 and row(db, obj.pk)["fencing_token"] == 7
    obj.fenced_save(7, update_fields=["label", "fencing_token"], using=db)  # naming it is harmless
    assert row(db, obj.pk)["label"] == "changed"


def test_deferred_fields_are_not_written(db: str) -> None:
    obj = item(db, stock=5)
    loaded = FencedItem.objects.using(db).only("label").get(pk=obj.pk)
    FencedItem.objects.using(db).filter(pk=obj.pk).update(stock=6)
    loaded.label = "deferred"
    loaded.fenced_save(3, using=db)
    assert row(db, obj.pk)["stock"] == 6 and row(db, obj.pk)["label"] == "deferred"


def test_an_existing_row_is_one_query_and_a_refusal_two(db: str) -> None:
    obj = item(db)
    with CaptureQueriesContext(connections[db]) as queries:
        obj.fenced_save(10, using=db)
    assert len(queries) == 1
    sql = queries[0]["sql"]
    assert sql.startswith("UPDATE") and "fencing_token" in sql and "IS NULL" in sql
    with CaptureQueriesContext(connections[db]) as queries, pytest.raises(StaleFencingToken):
        obj.fenced_save(9, using=db)
    assert [q["sql"].split()[0] for q in queries] == ["UPDATE", "SELECT"]


def test_a_deleted_row_is_not_recreated(db: str) -> None:
    obj = item(db)
    FencedItem.objects.using(db).filter(pk=obj.pk).delete()
    with pytest.raises(FencedItem.DoesNotExist, match="does not exist"):
        obj.fenced_save(1, using=db)
    assert not FencedItem.objects.using(db).exists()
    assert obj.fencing_token is None


def test_a_new_object_is_inserted_with_the_token(db: str, grant: Callable[[], Lock]) -> None:
    lease = grant()
    obj = FencedItem(label="new")
    with CaptureQueriesContext(connections[db]) as queries:
        obj.fenced_save(lease, using=db)
    assert [q["sql"].split()[0] for q in queries] == ["INSERT"]
    assert not obj._state.adding and obj._state.db == db
    assert row(db, obj.pk)["fencing_token"] == lease.fencing_token
    with pytest.raises(ValueError, match="update_fields is for existing rows"):
        FencedItem(label="x").fenced_save(lease, update_fields=["label"], using=db)


def test_a_failed_insert_leaves_the_token_attribute_as_it_was(db: str) -> None:
    obj = item(db)
    clash = FencedItem(pk=obj.pk, label="clash")
    with pytest.raises(IntegrityError):
        fenced_save(clash, 4, using=db)
    assert clash.fencing_token is None
    assert row(db, obj.pk)["label"] == "init"


def test_a_renamed_token_field(db: str) -> None:
    assert fencing_field(RenamedFenceItem).name == "lease_token"
    assert "fencing_token" not in {f.name for f in RenamedFenceItem._meta.get_fields()}
    obj = RenamedFenceItem.objects.using(db).create(label="a")
    obj.fenced_save(5, using=db)
    assert obj.lease_token == 5
    with pytest.raises(StaleFencingToken):
        obj.fenced_save(4, using=db)
    assert RenamedFenceItem.objects.using(db).filter(pk=obj.pk).fenced_update(6, label="b") == 1
    assert row(db, obj.pk, RenamedFenceItem) == {"id": obj.pk, "lease_token": 6, "label": "b"}


# -- validation and lease pre-checks -------------------------------------------


BAD_FENCES = [
    (True, TypeError),
    (False, TypeError),
    (None, TypeError),
    ("5", TypeError),
    (5.0, TypeError),
    (-1, ValueError),
    (2**63, ValueError),
]


@pytest.mark.parametrize(("fence", "error"), BAD_FENCES)
def test_bad_fences_are_refused_before_any_query(db: str, fence: Any, error: type) -> None:
    obj = item(db)
    obj.label = "changed"
    with CaptureQueriesContext(connections[db]) as queries:
        with pytest.raises(error, match="fenc"):
            obj.fenced_save(fence, using=db)
        with pytest.raises(error, match="fenc"):
            FencedItem.objects.using(db).fenced_update(fence, label="changed")
    assert len(queries) == 0
    assert row(db, obj.pk)["label"] == "init"


BAD_SAVE_ARGS = [
    ({"update_fields": "label"}, TypeError, "not a str"),
    ({"update_fields": []}, ValueError, "empty"),
    ({"update_fields": ["nope"]}, ValueError, "nope"),
    ({"update_fields": ["id"]}, ValueError, "id"),
    ({"update_fields": [1]}, TypeError, "non-str"),
    ({"using": "nope"}, ValueError, "DATABASES"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD_SAVE_ARGS)
def test_bad_save_arguments_are_refused(
    db: str, kwargs: dict[str, Any], error: type, match: str
) -> None:
    obj = item(db)
    obj.label = "changed"
    sent: list[Any] = []
    pre_save.connect(lambda **kw: sent.append(kw), sender=FencedItem, weak=False, dispatch_uid="v")
    try:
        with CaptureQueriesContext(connections[db]) as queries, pytest.raises(error, match=match):
            obj.fenced_save(7, **{"using": db, **kwargs})
    finally:
        pre_save.disconnect(sender=FencedItem, dispatch_uid="v")
    assert len(queries) == 0 and sent == []
    assert obj.fencing_token is None and row(db, obj.pk)["label"] == "init"


def test_models_without_exactly_one_token_field_are_refused() -> None:
    with pytest.raises(TypeError, match="no FencingTokenField"):
        fenced_save(Group(name="g"), 1)
    with pytest.raises(TypeError, match="model instance"):
        fenced_save("not a model", 1)  # type: ignore[arg-type]
    with pytest.raises(ImproperlyConfigured, match="several"):
        fencing_field(DoublyFenced)
    with pytest.raises(TypeError, match="no FencingTokenField"):
        FencedQuerySet(model=Group).fenced_update(1, name="x")


def test_the_field_is_nullable_and_not_editable() -> None:
    field = fencing_field(FencedItem)
    assert field.null and not field.editable
    assert field.deconstruct()[3] == {}
    with pytest.raises(TypeError, match="null=True"):
        FencingTokenField(null=False)
    with pytest.raises(TypeError, match="editable=False"):
        FencingTokenField(editable=True)


def test_a_handle_that_is_not_held_is_refused(setup: tuple[str, str], unique) -> None:
    alias, db = setup
    obj = item(db)
    lease = locks[alias].lock(unique("fence"), ttl=30)
    with CaptureQueriesContext(connections[db]) as queries:
        with pytest.raises(LockNotHeld, match="not held") as info:
            obj.fenced_save(lease, using=db)
        assert type(info.value) is LockNotHeld  # never acquired
    assert len(queries) == 0
    assert lease.acquire(timeout=10)
    lease.release()
    assert lease.fencing_token is not None
    with pytest.raises(LockNotHeld, match="not held") as info:
        obj.fenced_save(lease, using=db)  # released: its token is the last grant's
    assert type(info.value) is LockNotHeld
    with pytest.raises(LockNotHeld, match="not held"):
        FencedItem.objects.using(db).fenced_update(lease, label="x")
    assert row(db, obj.pk)["label"] == "init"


def test_a_lost_handle_is_refused_before_any_query(setup: tuple[str, str], unique) -> None:
    alias, db = setup
    obj = item(db)
    lease = locks[alias].lock(unique("fence"), ttl=0.2)
    assert lease.acquire(timeout=10)
    time.sleep(0.3)
    assert lease.lost
    obj.label = "late"
    with CaptureQueriesContext(connections[db]) as queries:
        with pytest.raises(LockLost, match="lost"):
            obj.fenced_save(lease, using=db)
        with pytest.raises(LockLost, match="lost"):
            FencedItem.objects.using(db).fenced_update(lease, label="late")
    assert len(queries) == 0
    assert row(db, obj.pk)["label"] == "init"
    with pytest.raises(LockLost):
        lease.release()


# -- signals --------------------------------------------------------------------


@pytest.fixture
def signals_seen() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def pre(**kwargs: Any) -> None:
        seen.append(("pre", kwargs))

    def post(**kwargs: Any) -> None:
        seen.append(("post", kwargs))

    pre_save.connect(pre, dispatch_uid="fencing-test-pre")
    post_save.connect(post, dispatch_uid="fencing-test-post")
    yield seen
    pre_save.disconnect(dispatch_uid="fencing-test-pre")
    post_save.disconnect(dispatch_uid="fencing-test-post")


def test_signals_are_sent_like_save(db: str, signals_seen: list[Any]) -> None:
    obj = FencedItem(label="new")
    obj.fenced_save(3, using=db)
    assert [(k, kw["sender"], kw.get("created")) for k, kw in signals_seen] == [
        ("pre", FencedItem, None),
        ("post", FencedItem, True),
    ]
    signals_seen.clear()
    obj.fenced_save(3, update_fields=["label"], using=db)
    pre, post = signals_seen
    assert pre[1]["instance"] is obj and pre[1]["using"] == db and pre[1]["raw"] is False
    assert pre[1]["update_fields"] == frozenset({"label"})
    assert post[0] == "post" and post[1]["created"] is False
    assert post[1]["update_fields"] == frozenset({"label"})
    signals_seen.clear()
    with pytest.raises(StaleFencingToken):
        obj.fenced_save(2, using=db)
    assert [k for k, _ in signals_seen] == ["pre"]  # as save(): pre_save precedes the write


def test_a_pre_save_receiver_change_is_written(db: str) -> None:
    obj = item(db)

    def shout(instance: FencedItem, **kwargs: Any) -> None:
        instance.label = instance.label.upper()

    pre_save.connect(shout, sender=FencedItem, dispatch_uid="shout")
    try:
        obj.label = "quiet"
        obj.fenced_save(1, using=db)
    finally:
        pre_save.disconnect(sender=FencedItem, dispatch_uid="shout")
    assert row(db, obj.pk)["label"] == "QUIET"


def test_a_proxy_is_the_sender(db: str, signals_seen: list[Any]) -> None:
    obj = FencedItemProxy.objects.using(db).create(label="p")
    signals_seen.clear()
    obj.fenced_save(1, using=db)
    assert [kw["sender"] for _, kw in signals_seen] == [FencedItemProxy, FencedItemProxy]
    assert row(db, obj.pk)["fencing_token"] == 1


# -- plain save -------------------------------------------------------------------


def test_plain_save_never_writes_the_token(db: str) -> None:
    obj = item(db)
    stale_copy = FencedItem.objects.using(db).get(pk=obj.pk)  # read at token NULL
    obj.fenced_save(8, using=db)
    stale_copy.label = "plain"
    with CaptureQueriesContext(connections[db]) as queries:
        stale_copy.save()
    assert "fencing_token" not in queries[0]["sql"]
    assert row(db, obj.pk)["label"] == "plain"
    assert row(db, obj.pk)["fencing_token"] == 8  # not lowered back to NULL
    with pytest.raises(StaleFencingToken):
        stale_copy.fenced_save(7, using=db)  # so the fence still holds


def test_plain_save_keeps_its_other_behaviour(db: str) -> None:
    obj = FencedItem(label="plain", fencing_token=4)
    obj.save(using=db)  # an INSERT writes every field
    assert row(db, obj.pk)["fencing_token"] == 4
    obj.label, obj.stock = "only-label", 50
    obj.save(update_fields=["label"])
    assert row(db, obj.pk)["label"] == "only-label" and row(db, obj.pk)["stock"] == 0
    loaded = FencedItem.objects.using(db).only("label").get(pk=obj.pk)
    loaded.label = "deferred"
    loaded.save()
    assert row(db, obj.pk)["stock"] == 0 and row(db, obj.pk)["label"] == "deferred"
    FencedItem.objects.using(db).filter(pk=obj.pk).delete()
    with pytest.raises(DatabaseError, match="did not affect any rows"):
        loaded.save()  # documented: not re-inserted, unlike Model.save()
    assert not FencedItem.objects.using(db).exists()


# -- fenced_update ------------------------------------------------------------------


def test_fenced_update_writes_the_rows_and_their_token(db: str, grant) -> None:
    lease = grant()
    rows = [item(db, label=f"r{i}", stock=3) for i in range(3)]
    FencedItem.objects.using(db).filter(pk=rows[0].pk).fenced_update(lease, label="r0")
    qs = FencedItem.objects.using(db).filter(pk__in=[r.pk for r in rows])
    with CaptureQueriesContext(connections[db]) as queries:
        assert qs.fenced_update(lease, stock=F("stock") - 1) == 3
    kinds = [q["sql"].split()[0] for q in queries]
    assert kinds.count("UPDATE") == 1 and kinds.count("SELECT") == 1
    for r in rows:
        assert row(db, r.pk)["stock"] == 2
        assert row(db, r.pk)["fencing_token"] == lease.fencing_token
    assert qs.filter(stock__gt=100).fenced_update(lease, stock=0) == 0


def test_fenced_update_is_all_or_nothing(db: str, grant) -> None:
    stale = grant().fencing_token
    newer = grant()
    rows = [item(db, label=f"r{i}", stock=3) for i in range(3)]
    FencedItem.objects.using(db).filter(pk=rows[1].pk).fenced_update(newer, label="newer")
    before = {r.pk: row(db, r.pk) for r in rows}
    qs = FencedItem.objects.using(db).filter(stock=3)
    with pytest.raises(StaleFencingToken) as info:
        qs.fenced_update(stale, stock=F("stock") - 1)
    assert {r.pk: row(db, r.pk) for r in rows} == before  # the allowed rows were not written
    assert info.value.token == stale and info.value.instance is None
    assert "1 row(s)" in str(info.value) and f"up to {newer.fencing_token}" in str(info.value)
    # Rows outside the filter do not matter; the newer holder writes everything.
    assert qs.exclude(pk=rows[1].pk).fenced_update(stale, label="ok") == 2
    assert qs.fenced_update(newer, label="all") == 3


def test_fenced_update_through_the_default_manager(db: str) -> None:
    obj = item(db, stock=1)
    assert FencedItem._default_manager.using(db).fenced_update(2, stock=F("stock") + 1) == 1
    assert FencedItem.objects.db_manager(db).fenced_update(2, stock=F("stock") + 1) == 1
    assert row(db, obj.pk)["stock"] == 3


def test_fenced_update_refuses_bad_values(db: str) -> None:
    obj = item(db)
    qs = FencedItem.objects.using(db)
    with CaptureQueriesContext(connections[db]) as queries:
        with pytest.raises(ValueError, match="at least one field"):
            qs.fenced_update(1)
        with pytest.raises(ValueError, match="itself"):
            qs.fenced_update(1, fencing_token=2)
        with pytest.raises(ValueError, match="cannot set nope"):
            qs.fenced_update(1, nope=2)
    assert len(queries) == 0
    with pytest.raises(TypeError, match="slice"):
        qs.all()[:1].fenced_update(1, label="x")
    assert row(db, obj.pk)["label"] == "init" and row(db, obj.pk)["fencing_token"] is None


# -- the paused holder, with real processes ------------------------------------------


def test_a_fenced_write_checks_and_bumps_an_optimistic_version(db: str, grant) -> None:
    """With a VersionField too, fenced and optimistic writers each see the other's writes."""
    obj = VersionedFencedItem.objects.using(db).create(stock=5)
    stale = VersionedFencedItem.objects.using(db).get(pk=obj.pk)
    obj.stock = 4
    obj.fenced_save(grant(), update_fields=["stock"], using=db)
    assert (obj.version, row_of(db, obj.pk)) == (2, (4, 2))
    stale.stock = 3
    with pytest.raises(VersionConflict):
        stale.save()  # read before the fenced write: refused
    assert row_of(db, obj.pk) == (4, 2)
    other = VersionedFencedItem.objects.using(db).get(pk=obj.pk)
    other.stock = 10
    other.save()  # an optimistic write after obj was read
    obj.stock = 0
    with pytest.raises(VersionConflict) as info:
        obj.fenced_save(grant(), using=db)  # newest token, stale version: refused
    assert info.value.expected_version == 2
    assert (obj.version, row_of(db, obj.pk)) == (2, (10, 3))
    VersionedFencedItem.objects.using(db).filter(pk=obj.pk).fenced_update(grant(), stock=7)
    assert row_of(db, obj.pk) == (7, 4)


def row_of(db: str, pk: int) -> tuple[int, int]:
    return VersionedFencedItem.objects.using(db).values_list("stock", "version").get(pk=pk)


def _paused_holder(alias: str, db: str, name: str, pk: int, out: Any) -> None:
    # ``out`` is a pipe end: send() is written before it returns (a Queue's
    # feeder thread would be stopped with the process, its data unsent).
    """Process A: acquire with a 1 s lease, read the row, stop, then try to write."""
    try:
        lease = locks[alias].lock(name, ttl=1)
        assert lease.acquire(timeout=10)
        token = lease.fencing_token
        assert token is not None
        obj = FencedItem.objects.using(db).get(pk=pk)  # the read of read-modify-write
        out.send(("held", token))
        os.kill(os.getpid(), signal.SIGSTOP)  # the pause (GC, swap, SIGSTOP) happens here
        outcomes: dict[str, Any] = {"lost": lease.lost}
        obj.label, obj.stock = "A", obj.stock - 1
        attempts: dict[str, Callable[[], Any]] = {
            "handle": lambda: obj.fenced_save(lease, using=db),
            "token": lambda: obj.fenced_save(token, using=db),
            "update": lambda: (
                FencedItem.objects.using(db)
                .filter(pk=pk)
                .fenced_update(token, stock=F("stock") - 1)
            ),
        }
        for what, attempt in attempts.items():
            try:
                attempt()
                outcomes[what] = "written"
            except DistLockError as exc:
                outcomes[what] = type(exc).__name__
        try:
            lease.release()
        except LockLost:
            outcomes["release"] = "LockLost"
        out.send(("done", outcomes))
    except BaseException as exc:
        out.send(("error", repr(exc)))
    finally:
        locks.close_all()
        connections.close_all()


def _receive(reader: Any, timeout: float) -> Any:
    assert reader.poll(timeout), "the child process sent nothing in time"
    return reader.recv()


def _wait_stopped(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


def test_a_paused_holder_cannot_overwrite_the_next_one(setup: tuple[str, str], unique) -> None:
    alias, db = setup
    name = unique("paused")
    obj = item(db, stock=10)
    connections.close_all()  # nothing shared with the child
    locks.close_all()
    reader, writer = FORK.Pipe(duplex=False)
    proc = FORK.Process(target=_paused_holder, args=(alias, db, name, obj.pk, writer))
    proc.start()
    writer.close()
    newer = None
    try:
        kind, a_token = _receive(reader, 30)
        assert kind == "held", a_token
        _wait_stopped(proc.pid, 10)
        # B: granted once A's lease has expired on the database's clock.
        newer = locks[alias].lock(name, ttl=30)
        assert newer.acquire(timeout=20)
        assert newer.fencing_token > a_token
        b_obj = FencedItem.objects.using(db).get(pk=obj.pk)
        b_obj.label, b_obj.stock = "B", b_obj.stock - 1
        b_obj.fenced_save(newer, using=db)
        os.kill(proc.pid, signal.SIGCONT)
        kind, outcomes = _receive(reader, 30)
        assert kind == "done", outcomes
        proc.join(10)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        reader.close()
        if newer is not None and newer.held:
            newer.release()
    assert outcomes == {
        "lost": True,
        "handle": "LockLost",  # the handle knows its lease ran out
        "token": "StaleFencingToken",  # the storage refuses the raw token
        "update": "StaleFencingToken",
        "release": "LockLost",
    }
    final = row(db, obj.pk)
    assert (final["label"], final["stock"]) == ("B", 9)
    assert final["fencing_token"] == newer.fencing_token


# -- multi-table inheritance: a newer holder's write racing the fenced write ----------


@contextmanager
def newer_write_before(
    db: str, write: Callable[[], None], *, nth: int, wait: bool
) -> Iterator[list[int]]:
    """Run ``write`` in another thread (its own connection) just before this
    connection runs its ``nth`` UPDATE (or, for ``nth=1``, a BEGIN that would
    take SQLite's write lock). ``wait``: join the thread before going on; else
    give it half a second (it may be blocked by this connection's locks) and
    join it when the block ends. Yields a list that holds 1 once fired."""
    fired: list[int] = []
    updates = [0]
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            write()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        word = sql.lstrip().split(None, 1)[0].upper()
        updates[0] += word == "UPDATE"
        if not fired and ((updates[0], word) == (nth, "UPDATE") or (nth, word) == (1, "BEGIN")):
            fired.append(1)
            thread = threading.Thread(target=run)
            threads.append(thread)
            thread.start()
            thread.join(None if wait else 0.5)
        return execute(sql, params, many, context)

    with connections[db].execute_wrapper(wrapper):
        yield fired
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    assert errors == []


MTI_MODELS = [FencedShop, FencedDepot, VersionedFencedShop]


def _newer_holder(db: str, model: Any, pk: Any) -> Callable[[], None]:
    def write() -> None:
        for _ in range(3):  # re-read after a version conflict (a model with a version)
            other = model.objects.using(db).get(pk=pk)
            other.label, other.stock = "ten", 10
            try:
                fenced_save(other, 10)
                return
            except VersionConflict:
                continue
        raise AssertionError("the newer holder never got its write in")

    return write


def _mti_row(db: str, model: Any, pk: Any) -> tuple[str, int, int]:
    found = model.objects.using(db).values_list("label", "stock", "fencing_token").get(pk=pk)
    return cast(tuple[str, int, int], found)


@pytest.mark.parametrize("model", MTI_MODELS, ids=lambda m: m.__name__)
def test_multi_table_fenced_save_refuses_a_newer_write_landing_before_it(
    db: str, model: Any
) -> None:
    obj = model.objects.using(db).create(label="start", stock=1)
    fenced_save(obj, 3)
    obj = model.objects.using(db).get(pk=obj.pk)
    obj.label, obj.stock = "five", 5
    newer = _newer_holder(db, model, obj.pk)
    with newer_write_before(db, newer, nth=1, wait=True) as fired, pytest.raises(StaleFencingToken):
        fenced_save(obj, 5)
    assert fired
    assert _mti_row(db, model, obj.pk) == ("ten", 10, 10)


@pytest.mark.parametrize("model", MTI_MODELS, ids=lambda m: m.__name__)
def test_multi_table_fenced_save_holds_the_row_until_all_tables_are_written(
    db: str, model: Any
) -> None:
    obj = model.objects.using(db).create(label="start", stock=1)
    obj.label, obj.stock = "five", 5
    with newer_write_before(db, _newer_holder(db, model, obj.pk), nth=2, wait=False) as fired:
        fenced_save(obj, 5)
    assert fired
    # The newer holder waited for this write to commit, then wrote over all of it.
    assert _mti_row(db, model, obj.pk) == ("ten", 10, 10)


@pytest.mark.parametrize("nth", [1, 2])
@pytest.mark.parametrize("model", MTI_MODELS, ids=lambda m: m.__name__)
def test_multi_table_fenced_update_is_not_check_then_write(db: str, model: Any, nth: int) -> None:
    obj = model.objects.using(db).create(label="start", stock=1)
    fenced_save(obj, 3)
    qs = model.objects.using(db).filter(pk=obj.pk)
    with newer_write_before(db, _newer_holder(db, model, obj.pk), nth=nth, wait=nth == 1):
        if nth == 1:
            with pytest.raises(StaleFencingToken):
                qs.fenced_update(5, label="five", stock=5)
        else:
            assert qs.fenced_update(5, label="five", stock=5) == 1
    assert _mti_row(db, model, obj.pk) == ("ten", 10, 10)


# -- transaction mode: a fenced write belongs to the holding transaction -------------


def _terminate_django_connection(db: str) -> None:
    pid = connections[db].connection.info.backend_pid
    params = settings.DATABASES[db]
    with psycopg.connect(host=params["HOST"], port=params["PORT"], user=params["USER"],
                         dbname=connections[db].settings_dict["NAME"], autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_postgres_transaction_mode_a_dead_holders_late_write_is_refused(unique) -> None:
    """A holds (transaction mode); its session is terminated; B is granted and writes. A's
    late fenced write through its handle (another connection) and with its int token
    are refused, and so is one on its dead connection: B's write stays (A's was
    accepted: B had been given A's token again, and the handle was taken anywhere)."""
    require_pg()
    backend, name = locks["pg-tx"], unique()
    obj = item("pg")
    holder = backend.lock(name)
    assert holder.acquire()
    try:
        _terminate_django_connection("pg")

        def newer_writes() -> int:
            with backend.lock(name, timeout=5) as newer:
                FencedItem.objects.using("pg").filter(pk=obj.pk).fenced_update(newer, label="B")
                return cast(int, newer.fencing_token)

        newer_token = in_thread(newer_writes)
        assert newer_token > cast(int, holder.fencing_token)

        def late_write(fence: Lock | int) -> None:
            late = FencedItem.objects.using("pg").get(pk=obj.pk)
            late.label = "A"
            late.fenced_save(fence, using="pg")

        with pytest.raises(UnsupportedOperation, match="transaction"):
            in_thread(lambda: late_write(holder))
        with pytest.raises(StaleFencingToken):
            in_thread(lambda: late_write(cast(int, holder.fencing_token)))
        with pytest.raises((LockLost, DatabaseError)):
            late_write(holder)  # on the holder's own connection, which is gone
    finally:
        with contextlib.suppress(DistLockError):
            holder.release()
        connections["pg"].close()
    assert row("pg", obj.pk)["label"] == "B"


@pytest.mark.parametrize("alias, db", [("sqlite-tx", "default"), ("pg-tx", "pg")])
def test_transaction_mode_fences_writes_of_its_own_transaction(alias: str, db: str,
                                                               unique) -> None:
    """A transaction-mode handle fences writes made in its transaction (its thread, its
    database); one elsewhere is refused before any query."""
    if db == "pg":
        require_pg()
    obj = item(db)

    def hold() -> None:
        with locks[alias].lock(unique()) as lease:
            mine = FencedItem.objects.using(db).get(pk=obj.pk)
            mine.label = "mine"
            mine.fenced_save(lease, using=db)

            def elsewhere() -> None:
                FencedItem.objects.using(db).filter(pk=obj.pk).fenced_update(lease, label="x")

            with pytest.raises(UnsupportedOperation, match="transaction"):
                in_thread(elsewhere, timeout=10)
            other_db = "default" if db == "pg" else next(iter(set(DATABASES) - {db}), None)
            if other_db is not None:
                with pytest.raises(UnsupportedOperation, match="transaction"):
                    FencedItem.objects.using(other_db).filter(pk=0).fenced_update(lease, label="x")

    in_thread(hold)
    assert row(db, obj.pk)["label"] == "mine"
