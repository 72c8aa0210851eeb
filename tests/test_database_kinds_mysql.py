"""MySQL and MariaDB lease mode's read-write locks and semaphores in the server: every
kind waits in one queue of named locks (``dl:q:<h>``), in arrival order, listed with its
kind; a hand-off is woken by the release of the grant in the way (its bell,
``dl:g:<h>:<token>``), not by the procedure's two-second look; a semaphore's head waits
on the permit that ends first and sees another's release at its next look. The kinds
on every database vendor are in ``test_database_kinds.py``."""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

import pytest

from django_distlock import locks

from .conftest import LIBRARY_DB, eventually, mysql_side, require_mysql
from .test_database_kinds_pg import handed_over

pytestmark = LIBRARY_DB


@pytest.fixture(autouse=True)
def _mysql() -> None:
    require_mysql()


def _waiting(backend: Any, name: str) -> list[str]:
    """The kinds of the name's listed waiters, first in line first."""
    return [waiter.kind for waiter in backend.waiters(name)]


def _bell_held(backend: Any, name: str, token: int) -> bool:
    """Whether a session holds the bell of the grant ``token`` of ``name``."""
    side = mysql_side(backend.database)
    try:
        cursor = side.cursor()
        cursor.execute(
            "SELECT IS_USED_LOCK(CONCAT('dl:g:', LEFT(SHA2(CONCAT(DATABASE(), 0x00, %s),"
            " 256), 32), ':', %s)) IS NOT NULL", [backend.make_key(name), token])
        return bool(cursor.fetchone()[0])
    finally:
        side.close()


def test_waiters_of_every_kind_queue_in_arrival_order_and_are_listed(unique) -> None:
    """A writer, readers and a ``lock()`` wait behind a writer: the listing shows each
    with its kind in arrival order, and they are served in that order (the readers
    behind the second writer wait for it, though a reader could share with the first)."""
    backend = locks["mysql-lease"]
    name = unique("queue")
    holder = backend.write_lock(name, ttl=30)
    assert holder.acquire()
    served: list[str] = []
    waiters = [("write", backend.write_lock), ("read", backend.read_lock),
               ("exclusive", backend.lock), ("read", backend.read_lock)]

    def wait(label: str, make: Any) -> None:
        with make(name, timeout=30):
            served.append(label)
            time.sleep(0.05)

    threads = []
    for i, (kind, make) in enumerate(waiters):
        threads.append(threading.Thread(target=wait, args=(f"{i}:{kind}", make)))
        threads[-1].start()
        assert eventually(lambda i=i: len(_waiting(backend, name)) == i + 1)
    assert _waiting(backend, name) == [kind for kind, _ in waiters]
    read_now = backend.read_lock(name)
    assert not read_now.acquire(blocking=False)  # a first attempt does not pass the queue
    holder.release()
    for thread in threads:
        thread.join(30)
    assert served == ["0:write", "1:read", "2:exclusive", "3:read"]
    assert _waiting(backend, name) == []


def test_a_release_wakes_the_head_waiting_on_its_bell(unique) -> None:
    """The head sleeps in GET_LOCK on the bell of the grant in its way, which that
    grant's release gives back: every hand-off comes at once (holders' leases of 60 s;
    the procedure looks again only every two seconds), also for a ``lock()`` waiter
    behind two readers, woken by each reader's release in turn."""
    backend = locks["mysql-lease"]
    name = unique("wake")
    cases = [  # (holders, waiter)
        ([lambda: backend.write_lock(name, ttl=60)], lambda: backend.read_lock(name)),
        ([lambda: backend.read_lock(name, ttl=60)], lambda: backend.write_lock(name)),
        ([lambda: backend.semaphore(name, 1, ttl=60)], lambda: backend.semaphore(name, 1)),
        ([lambda: backend.lock(name, ttl=60)], lambda: backend.read_lock(name)),
        ([lambda: backend.read_lock(name, ttl=60)] * 2, lambda: backend.lock(name)),
    ]
    for holders_of, waiter_of in cases:
        holders, waiter = [make() for make in holders_of], waiter_of()
        assert all(holder.acquire() for holder in holders)
        *first, last = holders
        for holder in first:
            holder.release()
        took = handed_over(lambda: len(_waiting(backend, name)) == 1,
                           partial(waiter.acquire, timeout=20), last.release)
        kinds = "+".join(holder.kind for holder in holders)
        assert took < 1.0, f"{waiter.kind} waited {took:.2f} s after {kinds}'s release"
        waiter.release()


def test_a_lock_waiter_behind_readers_is_woken_by_each_release(unique) -> None:
    """Two readers hold (the later grant ends first: the row's last token is its); a
    ``lock()`` waits on the bell of the share that ends first. Its release wakes the
    waiter, which gives that bell back and waits on the other reader's (it does not keep
    the bell and look again in a second, as it does for a holder that died); that
    release lets it in at once."""
    backend = locks["mysql-lease"]
    name = unique("readers")
    late, early = backend.read_lock(name, ttl=60), backend.read_lock(name, ttl=40)
    assert late.acquire() and early.acquire()
    waiter = backend.lock(name)
    got: list[float] = []
    thread = threading.Thread(
        target=lambda: got.append(time.monotonic()) if waiter.acquire(timeout=20) else None)
    thread.start()
    assert eventually(lambda: len(_waiting(backend, name)) == 1)
    time.sleep(0.1)
    early_token = early.fencing_token
    early.release()
    time.sleep(0.3)
    assert not got  # the late reader still holds
    assert not _bell_held(backend, name, early_token)  # the waiter moved on to late's
    released = time.monotonic()
    late.release()
    thread.join(20)
    assert got and got[0] - released < 1.0, got
    waiter.release()


def test_a_semaphores_head_sees_another_permits_release_at_its_next_look(unique) -> None:
    """GET_LOCK waits for one lock: a semaphore's head waits on the bell of the permit
    that ends first. The release of another permit is seen at the head's next look,
    within the procedure's two seconds (docs/database.md)."""
    backend = locks["mysql-lease"]
    name = unique("permits")
    ends_first, other = backend.semaphore(name, 2, ttl=30), backend.semaphore(name, 2, ttl=60)
    assert ends_first.acquire() and other.acquire()
    waiter = backend.semaphore(name, 2)
    took = handed_over(lambda: len(_waiting(backend, name)) == 1,
                       partial(waiter.acquire, timeout=20), other.release)
    assert took < 2.0 + 1.0, took
    waiter.release()
    ends_first.release()


def test_a_shares_bell_is_held_by_its_session_and_given_back(unique) -> None:
    """Each reader's or permit's grant takes its own bell (by its token) on the granting
    session; its release gives it back, also when made from another thread."""
    backend = locks["mysql-lease"]
    for make in (partial(backend.read_lock, ttl=30), partial(backend.semaphore, limit=2, ttl=30)):
        name = unique("bell")
        handle = make(name)
        assert handle.acquire()
        token = handle.fencing_token
        assert _bell_held(backend, name, token)
        thread = threading.Thread(target=handle.release)
        thread.start()
        thread.join(10)
        assert eventually(lambda n=name, t=token: not _bell_held(backend, n, t))
