"""ZooKeeper's reentrant locks (Curator's ``InterProcessMutex`` count) and the write
lock's downgrade to its read side, against the ensemble that scripts/test starts."""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from kazoo.exceptions import NoNodeError

from django_distlock import locks
from django_distlock.backends.zookeeper import ZooKeeperBackend
from django_distlock.exceptions import LockLost

from .conftest import eventually, in_thread, require_zookeeper


@pytest.fixture
def zk() -> ZooKeeperBackend:
    require_zookeeper()
    backend = locks["zk"]
    assert isinstance(backend, ZooKeeperBackend)
    return backend


def _children(backend: ZooKeeperBackend, name: str) -> list[str]:
    parent = backend.parent_of(backend.make_key(name))
    try:
        return sorted(backend.client.get().get_children(parent))
    except NoNodeError:
        return []


def test_an_inner_acquire_creates_no_second_node(zk, unique) -> None:
    """Acquiring again (the same handle, or another handle of the owner) counts up on the
    one node; it goes with the last release."""
    name, owner = unique(), unique("owner")
    outer = zk.lock(name, reentrant=True, owner=owner)
    assert outer.acquire(blocking=False)
    node = _children(zk, name)
    assert outer.acquire(blocking=False)
    other = zk.lock(name, reentrant=True, owner=owner)
    assert in_thread(lambda: other.acquire(blocking=False)) is True
    assert _children(zk, name) == node and len(node) == 1
    assert other.fencing_token == outer.fencing_token
    outer.release()
    outer.release()
    assert _children(zk, name) == node, "the other handle still holds it"
    in_thread(other.release)
    assert _children(zk, name) == []


def test_an_owner_queued_before_the_grant_rides_on_it(zk, unique) -> None:
    """A handle of the owner that queued while a stranger held is woken by the grant of
    the owner's first handle, drops its node and shares that one."""
    name, owner = unique(), unique("owner")
    stranger = zk.lock(name)
    stranger.acquire()
    first = zk.lock(name, reentrant=True, owner=owner, timeout=10)
    second = zk.lock(name, reentrant=True, owner=owner, timeout=10)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda h=h: results.append(h.acquire()))
               for h in (first, second)]
    for count, thread in enumerate(threads, 2):
        thread.start()
        assert eventually(lambda count=count: len(_children(zk, name)) == count)
    stranger.release()
    for thread in threads:
        thread.join(10)
    assert results == [True, True]
    assert len(_children(zk, name)) == 1
    assert in_thread(lambda: zk.lock(name).acquire(blocking=False)) is False
    in_thread(first.release)
    in_thread(second.release)
    assert _children(zk, name) == []


def test_acquiring_again_after_a_force_release_is_lost(zk, unique) -> None:
    """The inner acquire reads the node: one force-released is not held again."""
    name = unique()
    handle = zk.lock(name, reentrant=True)
    assert handle.acquire()
    assert zk.force_release(name)
    with pytest.raises(LockLost):
        handle.acquire(blocking=False)
    assert in_thread(lambda: zk.lock(name).acquire(blocking=False)) is True


def test_another_session_with_the_owner_waits(zk, unique) -> None:
    """The node belongs to this process' session: another session (another process)
    with the same ``owner`` does not share it (it would go with our session)."""
    name, owner = unique(), unique("owner")
    held = zk.lock(name, reentrant=True, owner=owner)
    assert held.acquire()
    other = ZooKeeperBackend("zk-other", settings.DISTLOCK[zk.alias])
    try:
        waiter = other.lock(name, reentrant=True, owner=owner, timeout=0.3)
        assert waiter.acquire() is False
    finally:
        other.close()
    held.release()
