"""ZooKeeper hand-offs in a queue of several waiters, against the 3-node ensemble: the
requests a waiter sends per grant (kazoo's ``Lock`` sends 6: exists of the parent, create,
get_children, a watch on the node ahead, get_children again, delete), and who sends them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from django_distlock.backends.zookeeper import ZooKeeperBackend

from .conftest import eventually


def _another(zk: ZooKeeperBackend, alias: str) -> ZooKeeperBackend:
    """Another client (a session of its own) of the same locks as ``zk``."""
    return ZooKeeperBackend(alias, settings.DISTLOCK[zk.alias])


def _queued(zk: ZooKeeperBackend, name: str) -> int:
    parent = zk.parent_of(zk.make_key(name))
    kazoo = zk.client.get()
    return len(kazoo.get_children(parent)) if kazoo.exists(parent) else 0


@pytest.fixture
def third(zk: ZooKeeperBackend) -> Iterator[ZooKeeperBackend]:
    backend = _another(zk, "zk-third")
    yield backend
    backend.close()


def _record(backend: ZooKeeperBackend, monkeypatch: Any) -> list[tuple[str, str]]:
    """(request type, name of the thread that sent it) of every request ``backend`` sends."""
    kazoo = backend.client.get()
    sent: list[tuple[str, str]] = []
    real = kazoo._call

    def call(request: Any, result: Any) -> Any:
        sent.append((type(request).__name__, threading.current_thread().name))
        return real(request, result)

    monkeypatch.setattr(kazoo, "_call", call)
    return sent


def test_a_waiter_behind_another_waiter_lists_again_while_it_holds(
    zk, unique, third, monkeypatch
):
    """Holder H, waiter A (next), then waiter B in a session of its own. B watches A and
    H (not its own node: it is not next). H's release grants A and has B list again
    (kazoo's callback thread sends the listing as the event arrives) while A holds: B is
    next, and watches its own node. A's release then grants B by its delete event, with
    no request between that event and the grant (kazoo's ``Lock`` lists the children
    there: a read that waits in the server behind the writes queued before it)."""
    name = unique()
    holder = zk.lock(name)
    assert holder.acquire()
    first = zk.lock(name, timeout=30)
    sent = _record(third, monkeypatch)
    waiting = third.lock(name, timeout=30)
    got = threading.Event()

    def wait() -> None:
        with waiting:
            got.set()

    with_first = threading.Thread(target=first.acquire)
    with_first.start()
    assert eventually(lambda: _queued(zk, name) == 2)
    waiter = threading.Thread(target=wait, name="waiter-b")
    waiter.start()
    assert eventually(lambda: len(sent) == 4)
    holder.release()
    with_first.join(30)
    assert first.held
    assert eventually(lambda: len(sent) == 6)
    assert not got.is_set()
    first.release()
    waiter.join(30)
    assert got.is_set()
    assert [kind for kind, _ in sent] == [
        "Create2", "GetChildren", "Exists", "Exists",  # the watches on A and on H
        "GetChildren", "Exists",  # H went: list again, then watch our node (we are next)
        "Delete",  # A went: granted
    ]
    assert sent[4][1] != "waiter-b"  # the listing after H went: kazoo's callback thread
    assert {thread for _, thread in sent[5:]} == {"waiter-b"}


def test_a_release_wakes_the_next_waiter_and_the_one_after_it(zk, unique) -> None:
    """5 waiters queue behind a holder; each release wakes the waiter it grants and the
    one after it (which lists again), no other: 5 and 4 watch events, whatever the
    queue's length."""
    name = unique()
    holder = zk.lock(name)
    holder.acquire()
    order: list[int] = []

    def wait(i: int) -> None:
        with zk.lock(name, timeout=30):
            order.append(i)
            time.sleep(0.02)

    granting, listing = zk.client.watch_events, zk.client.ahead_events
    threads = []
    for i in range(5):
        threads.append(threading.Thread(target=wait, args=(i,)))
        threads[-1].start()
        assert eventually(lambda i=i: _queued(zk, name) == i + 2)  # queued in order
    holder.release()
    for thread in threads:
        thread.join(30)
    assert order == [0, 1, 2, 3, 4]  # first come, first served
    assert zk.client.watch_events - granting == 5
    assert zk.client.ahead_events - listing == 4
