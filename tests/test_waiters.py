"""Who waits for a lock: ``waiters()`` on every backend that keeps a queue, with real
waiters (threads, and a process of its own) on the real servers, the listing's count,
the admin's detail page and ``manage.py distlock inspect``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.urls import reverse

from django_distlock import locks
from django_distlock.exceptions import UnsupportedOperation
from django_distlock.handle import Lock
from django_distlock.testing.contract.support import io_calls
from django_distlock.values import WaiterInfo

from .conftest import (
    DATABASES,
    eventually,
    require_alias,
    require_pg,
)

pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]

QUEUED = ["locmem", "redis", "redis-cluster", "pg-lease", "mysql-lease", "zk"]



class Waiter:
    """A thread that waits for ``name`` (``timeout`` seconds), then holds it until told."""

    def __init__(
        self, alias: str, name: str, timeout: float, label: str, hold: bool = True
    ) -> None:
        self.handle: Lock = locks[alias].lock(name, ttl=30, timeout=timeout)
        self.hold = hold
        self.got: bool | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=label, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.got = self.handle.acquire()
        if self.got:
            if self.hold:
                self.done.wait(30)
            self.handle.release()

    def finish(self) -> None:
        self.done.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def _count(alias: str, name: str, n: int) -> Callable[[], bool]:
    return lambda: len(locks[alias].waiters(name)) == n


def _queue_up(
    alias: str, name: str, makers: Sequence[Callable[..., Lock]], threads: list[threading.Thread]
) -> None:
    """One thread per maker, in turn, waits for ``name`` (each listed before the next
    starts), then takes and frees it; the threads go into ``threads``."""
    for count, make in enumerate(makers, 1):
        handle = make(name, ttl=30, timeout=20)
        thread = threading.Thread(target=lambda h=handle: h.acquire() and h.release())
        thread.start()
        threads.append(thread)
        assert eventually(_count(alias, name, count))


@pytest.fixture
def holder(unique: Callable[[str], str]) -> Iterator[Callable[[str], Lock]]:
    held: list[Lock] = []

    def hold(alias: str) -> Lock:
        require_alias(alias)
        handle = locks[alias].lock(unique("w"), ttl=30, timeout=5)
        assert handle.acquire()
        held.append(handle)
        return handle

    yield hold
    for handle in held:
        if handle.held:
            handle.release()
    locks.close_all()


@pytest.mark.parametrize("alias", QUEUED)
def test_waiters_in_arrival_order_and_one_that_gave_up_goes(
    alias: str, holder: Callable[[str], Lock]
) -> None:
    held = holder(alias)
    backend, name = locks[alias], held.name
    assert backend.waiters(name) == []
    first = Waiter(alias, name, 1.0, "waiter-A")  # gives up first
    assert eventually(_count(alias, name, 1))
    second = Waiter(alias, name, 20, "waiter-B")
    assert eventually(_count(alias, name, 2))
    a, b = backend.waiters(name)
    assert (a.position, b.position) == (1, 2)
    assert a.since is None or b.since is None or a.since <= b.since
    if alias != "pg-lease":  # behind PostgreSQL's head, only the server session shows
        assert a.owner and b.owner and a.owner != b.owner
    if alias != "pg-lease" or a.owner:  # all store the waiter's thread (PG: its head's)
        assert a.thread == "waiter-A" and a.pid == os.getpid() and a.host
    if backend.supports_listing:
        [info] = backend.held_locks(prefix=name)
        assert info.waiters == 2
    first.thread.join(10)  # its timeout ends
    assert first.got is False
    assert eventually(_count(alias, name, 1))
    [only] = backend.waiters(name)
    assert only.position == 1
    if alias != "pg-lease" or only.owner:  # the PostgreSQL head shows its owner
        assert only.owner != a.owner
    held.release()
    assert eventually(lambda: second.got is True)
    assert second.handle.owner_id == (only.owner or b.owner or second.handle.owner_id)
    assert backend.waiters(name) == []
    second.finish()
    if alias.startswith("redis"):  # the waiters' entries (and who they were) are gone
        waiters_key = backend.keys_for(backend.make_key(name)).waiters  # type: ignore[attr-defined]
        assert backend.redis.sync().hlen(waiters_key) == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("alias", ["redis", "pg-lease"])
def test_a_waiting_process_is_listed_after_a_waiting_thread(
    alias: str, holder: Callable[[str], Lock]
) -> None:
    held = holder(alias)
    backend, name = locks[alias], held.name
    thread = Waiter(alias, name, 20, "waiter-T")
    assert eventually(_count(alias, name, 1))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, alias, name],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
             "DISTLOCK_PG_NAME": connections["pg"].settings_dict["NAME"]},
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert eventually(_count(alias, name, 2), timeout=20)
        listed = backend.waiters(name)
        assert [w.position for w in listed] == [1, 2]
        assert listed[0].pid == os.getpid() and listed[0].thread == "waiter-T"
        if alias == "redis":
            assert listed[1].pid == child.pid and listed[0].owner != listed[1].owner
        else:  # behind the head (its row's reservation) only the child's server session
            assert listed[1].session.startswith("pg ") and listed[1].since is not None
        held.release()
        assert eventually(lambda: thread.got is True)
        thread.finish()
        out, _ = child.communicate(timeout=30)
        assert out.strip() == "True"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


_CHILD = """
import sys, django
django.setup()
from django_distlock import locks
handle = locks[sys.argv[1]].lock(sys.argv[2], ttl=30, timeout=20)
got = handle.acquire()
if got:
    handle.release()
print(got)
locks.close_all()
"""


@pytest.mark.parametrize("alias", ["redis", "zk"])
def test_the_kind_each_waits_for(alias: str, unique: Callable[[str], str]) -> None:
    require_alias(alias)
    backend = locks[alias]
    name = unique("rw")
    writer = backend.write_lock(name, ttl=30)
    assert writer.acquire()
    waiting: list[threading.Thread] = []
    try:
        _queue_up(alias, name, (backend.read_lock, backend.write_lock), waiting)
        assert [w.kind for w in backend.waiters(name)] == ["read", "write"]
    finally:
        writer.release()
        for thread in waiting:
            thread.join(30)
    locks.close_all()


@pytest.mark.parametrize("alias", ["redis", "zk"])
def test_limit_bounds_the_waiters_read(alias: str, holder: Callable[[str], Lock]) -> None:
    held = holder(alias)
    backend, name = locks[alias], held.name
    waiting = []
    for i in range(3):
        waiting.append(Waiter(alias, name, 20, f"w{i}", hold=False))
        assert eventually(_count(alias, name, i + 1))
    everyone = backend.waiters(name)
    assert backend.waiters(name, limit=2) == everyone[:2]
    assert len(backend.waiters(name, limit=1000)) == 3
    held.release()
    for waiter in waiting:
        assert eventually(lambda w=waiter: w.got is True, timeout=20)  # type: ignore[misc]
        waiter.finish()


def test_refusals_and_bad_limits_before_any_call() -> None:
    for alias in ["sqlite-lease", "sqlite-tx", "pg-tx", "redlock", "cache-memcached", "zk"]:
        require_alias(alias)
        backend = locks[alias]
        bad = ((0, ValueError), (1001, ValueError), (True, TypeError), ("3", TypeError))
        for limit, error in bad:
            with io_calls(backend) as calls, pytest.raises(error):
                backend.waiters("x", limit=limit)
            assert calls == []
        if backend.supports_waiters:
            continue
        with io_calls(backend) as calls, pytest.raises(UnsupportedOperation) as refused:
            backend.waiters("x")
        assert calls == []
        # The refusal says why (the backend's reason), not just the flag's name.
        assert "cannot list the waiters" in str(refused.value)
        assert "supports_waiters is False" not in str(refused.value), alias


def test_detail_page_and_inspect_show_the_waiters(holder: Callable[[str], Lock]) -> None:
    held = holder("locmem")
    name = held.name
    waiting = [Waiter("locmem", name, 20, "waiter-A", hold=False)]
    assert eventually(_count("locmem", name, 1))
    waiting.append(Waiter("locmem", name, 20, "waiter-B", hold=False))
    assert eventually(_count("locmem", name, 2))
    try:
        client = Client()
        client.force_login(User.objects.create_superuser("boss", "b@example.com", "pw"))
        url = reverse("admin:django_distlock_held_lock")
        page = client.get(url, {"alias": "locmem", "name": name}).content.decode()
        assert 'id="distlock-waiters"' in page
        assert page.index("waiter-A") < page.index("waiter-B")
        assert "Waiting for" in page
        text = StringIO()
        call_command("distlock", "inspect", "locmem", name, stdout=text)
        out = text.getvalue()
        assert "waiters: 2" in out and out.index("waiter-A") < out.index("waiter-B")
        data = StringIO()
        call_command("distlock", "inspect", "locmem", name, "--json", stdout=data)
        listed: list[dict[str, Any]] = json.loads(data.getvalue())["waiting"]
        assert [w["thread"] for w in listed] == ["waiter-A", "waiter-B"]
        assert [w["position"] for w in listed] == [1, 2] and listed[0]["since"]
    finally:
        held.release()
        for waiter in waiting:
            assert eventually(lambda w=waiter: w.got is True)  # type: ignore[misc]
            waiter.finish()


def test_detail_page_says_why_a_backend_cannot_tell() -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "b@example.com", "pw"))
    handle = locks["sqlite-lease"].lock("who-waits", ttl=30)
    assert handle.acquire()
    try:
        url = reverse("admin:django_distlock_held_lock")
        page = client.get(url, {"alias": "sqlite-lease", "name": "who-waits"}).content.decode()
        assert "SQLite keeps no queue" in page
    finally:
        handle.release()


def test_waiter_info_splits_the_holder_field() -> None:
    from django_distlock.values import join_holder

    info = WaiterInfo(1, "abcd1234", None, thread=join_holder("t1", "GET /x"))
    assert (info.thread, info.context) == ("t1", "GET /x")


def test_postgresql_lists_both_of_its_queues(unique: Callable[[str], str]) -> None:
    """A reader and a writer queue on the name's kinds queue, ``lock(name)`` on its
    exclusive queue: all three listed (the exclusive queue first), and counted."""
    require_pg()
    backend = locks["pg-lease"]
    name = unique("pgrw")
    writer = backend.write_lock(name, ttl=30)
    assert writer.acquire()
    waiting: list[threading.Thread] = []
    try:
        makers = (backend.read_lock, backend.write_lock, backend.lock)
        _queue_up("pg-lease", name, makers, waiting)
        head, *shares = backend.waiters(name)
        assert head.kind == "exclusive" and head.owner and head.pid == os.getpid()
        assert [w.position for w in shares] == [2, 3]
        assert all(w.session.startswith("pg ") for w in shares)
        [info] = backend.held_locks(prefix=name)
        assert info.waiters == 3
    finally:
        writer.release()
        for thread in waiting:
            thread.join(30)
    assert backend.waiters(name) == []
    locks.close_all()


def test_postgresql_kinds_waiters_have_their_kind_and_since(
    unique: Callable[[str], str],
) -> None:
    """Readers, writers and permits waiting on PostgreSQL's kinds queue are listed with
    the kind they wait for, since when (the server's clock, in arrival order), and their
    owner id, process and thread: the head of the queue too (migration 0014's rows)."""
    require_pg()
    backend = locks["pg-lease"]
    with connections["pg"].cursor() as cursor:
        cursor.execute("SELECT now()")
        began = cursor.fetchone()[0]
    rw, sem = unique("pgkinds"), unique("pgsem")
    writer = backend.write_lock(rw, ttl=30)
    permit = backend.semaphore(sem, 1, ttl=30)
    assert writer.acquire() and permit.acquire()
    waiting: list[threading.Thread] = []
    try:
        makers = (backend.read_lock, backend.write_lock, backend.read_lock)
        _queue_up("pg-lease", rw, makers, waiting)
        _queue_up("pg-lease", sem, (lambda n, **o: backend.semaphore(n, 1, **o),) * 2, waiting)
        listed = backend.waiters(rw)
        assert [w.kind for w in listed] == ["read", "write", "read"]
        assert [w.kind for w in backend.waiters(sem)] == ["semaphore", "semaphore"]
        since = [w.since for w in listed]
        assert all(s is not None and s >= began for s in since), since
        assert since == sorted(since)  # type: ignore[type-var]
        assert all(w.pid == os.getpid() and w.owner and w.thread for w in listed)
        assert len({w.owner for w in listed}) == 3
        assert all(w.session.startswith("pg ") for w in listed)
        # The detail page: each row's kind and "waiting for" (from its since).
        client = Client()
        client.force_login(User.objects.create_superuser("boss", "b@example.com", "pw"))
        page = client.get(reverse("admin:django_distlock_held_lock"),
                          {"alias": "pg-lease", "name": rw}).content.decode()
        cells = re.findall(r'<tr class="distlock-waiter".*?</tr>', page, re.S)
        assert len(cells) == 3
        for row, kind in zip(cells, ("read", "write", "read"), strict=True):
            assert f"<td>{kind}</td>" in row and re.search(r"<td>\d+\.\d s</td>", row), row
    finally:
        writer.release()
        permit.release()
        for thread in waiting:
            thread.join(30)
    assert backend.waiters(rw) == [] and backend.waiters(sem) == []
    locks.close_all()
