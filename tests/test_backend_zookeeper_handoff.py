"""ZooKeeper hand-offs in a queue of several waiters, against the 3-node ensemble: the
requests a waiter sends per grant (kazoo's ``Lock`` sends 6: exists of the parent, create,
get_children, a watch on the node ahead, get_children again, delete), and who sends them."""

from __future__ import annotations

import threading
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


def test_a_waiter_behind_another_waiter_sends_five_requests(zk, unique, third, monkeypatch):
    """Holder H, waiter A (next), then waiter B in a session of its own. B watches only A
    (no watch on its own node: B's grant comes from a listing, which shows its node); when
    A's node goes, B's listing is sent at once by kazoo's callback thread, before B's
    thread has woken up. 5 requests for B's grant, kazoo's ``Lock`` sends 6."""
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
    assert eventually(lambda: len(sent) == 3)
    holder.release()
    with_first.join(30)
    assert first.held
    first.release()
    waiter.join(30)
    assert got.is_set()
    assert [kind for kind, _ in sent] == ["Create2", "GetChildren", "Exists", "GetChildren",
                                         "Delete"]
    assert sent[3][1] != "waiter-b"  # the listing after the wake-up: kazoo's callback thread
    assert sent[4][1] == "waiter-b"
