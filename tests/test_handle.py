"""The handle layer: its record of what each thread and task holds (``SelfDeadlock``),
its construction, and its seam (no other module reads a private member of a Lock)."""

from __future__ import annotations

import ast
import asyncio
import gc
import re
import threading
import time
from pathlib import Path

import pytest

import django_distlock
from django_distlock import locks
from django_distlock.backends import base
from django_distlock.backends.locmem import LocMemAcquisition, LocMemBackend
from django_distlock.exceptions import LockNotAcquired
from django_distlock.handle import Lock, hold_of
from django_distlock.hold import Hold
from django_distlock.kinds import Kind


def _run(target) -> int:
    """Run ``target`` in a new thread, wait for its end, return the thread's ident."""
    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert thread.ident is not None
    return thread.ident


def test_a_new_thread_reusing_a_finished_threads_ident_holds_nothing(unique) -> None:
    """A thread ended while its handle held the lock (the handle outlives it, and may be
    released from any thread); a new thread that the OS gives the same ident holds
    nothing: it waits for the name, it is not refused with SelfDeadlock."""
    backend, name = locks["locmem"], unique()
    kept: list[Lock] = []

    def hold() -> None:
        handle = backend.lock(name, ttl=30)
        assert handle.acquire()
        kept.append(handle)

    # Threads of the process that end after the first (as an earlier test's may): made
    # here, so that the search below must find the first's stack past theirs.
    others = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(3)]
    for thread in others:
        thread.start()
    first = _run(hold)
    for thread in others:
        thread.join(30)
    outcomes: list[object] = []

    def wait_if_reused() -> None:
        if threading.get_ident() != first:
            return
        try:
            outcomes.append(backend.lock(name, ttl=30).acquire(timeout=0.1))
        except Exception as exc:
            outcomes.append(exc)

    # The C library gives a new thread the stack (and so the ident) of a thread ended
    # lately, the last ended first. One new thread at a time gets the stack of the one
    # before it, and never the first's once other threads ended after the first (probed:
    # with 3 such threads, 0 of 20 tries reused the ident; with 1, 19 of 20). Eight
    # threads alive at once take eight kept stacks.
    def wait_together(barrier: threading.Barrier) -> None:
        barrier.wait(30)
        wait_if_reused()

    for _ in range(50):
        barrier = threading.Barrier(8)
        batch = [threading.Thread(target=wait_together, args=(barrier,)) for _ in range(8)]
        for thread in batch:
            thread.start()
        for thread in batch:
            thread.join(30)
        if outcomes:
            break
    assert outcomes, "no new thread reused the ident (the test could not run)"
    assert outcomes == [False]  # held by the first thread's handle: a miss at the timeout
    kept[0].release()


def test_a_new_task_reusing_a_finished_tasks_id_holds_nothing(unique) -> None:
    """The same for asyncio tasks: 200 tasks end while their handles hold 200 names; new
    tasks at the same addresses (the same ``id()``) wait for those names (a miss at the
    timeout) instead of being refused with SelfDeadlock."""
    backend, prefix = locks["locmem"], unique()
    kept: list[Lock] = []

    async def hold(index: int) -> tuple[int, str]:
        handle = backend.lock(f"{prefix}:{index}", ttl=30)
        assert await handle.aacquire()
        kept.append(handle)
        return id(asyncio.current_task()), handle.name

    async def wait_if_reused(names: dict[int, str]) -> object:
        name = names.get(id(asyncio.current_task()))
        if name is None:
            return None
        try:
            return await backend.lock(name, ttl=30).aacquire(timeout=0.01)
        except Exception as exc:
            return exc

    async def main() -> list[object]:
        names = dict(await asyncio.gather(*(hold(index) for index in range(200))))
        await asyncio.sleep(0)  # the loop drops its last references to the finished tasks
        gc.collect()  # ... which are freed: their addresses may be reused
        outcomes = await asyncio.gather(*(wait_if_reused(names) for _ in range(200)))
        return [outcome for outcome in outcomes if outcome is not None]

    outcomes = asyncio.run(main())
    assert outcomes, "no new task reused an id() (the test could not run)"
    assert outcomes == [False] * len(outcomes)
    for handle in kept:
        handle.release()


# -- the seam -----------------------------------------------------------------------

#: The modules that make up the handle: the user's class and its state component.
HANDLE_MODULES = {"handle.py", "hold.py"}

#: The user's API of a Lock (docs/api.md documents each, with an example); the seam
#: for backends and the watchdog is the Hold's (``hold_of(lock)``), not the Lock's.
LOCK_API = {
    "acquire", "aacquire", "release", "arelease", "extend", "aextend", "locked",
    "backend", "name", "key", "kind", "options",
    "fencing_token", "acquired_at", "expires_at", "held", "held_for", "lost", "owner_id",
    "holder",
}


def _private_names() -> set[str]:
    """The private members of a Lock and its Hold: instance attributes and methods."""
    handle = locks["locmem"].lock("private-names")
    names = set(vars(handle)) | set(dir(Lock)) | set(vars(hold_of(handle))) | set(dir(Hold))
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def test_a_lock_shows_the_users_api_only() -> None:
    """Every public member of a Lock is documented user API (no member exists for the
    backends or the watchdog), and each has an example in its docstring."""
    handle = locks["locmem"].lock("public-names")
    public = {name for name in set(vars(handle)) | set(dir(Lock)) if not name.startswith("_")}
    assert public == LOCK_API
    source = Path(django_distlock.__file__).with_name("handle.py").read_text()
    for name in sorted(LOCK_API):
        member = getattr(Lock, name, None)
        doc = getattr(member, "__doc__", None)
        if doc is None or isinstance(member, str | type(None)) or name in vars(handle):
            # An instance attribute: documented by the ``#:`` lines right above it.
            above = re.split(rf"        self\.{name}(?:: \w+)? = ", source, maxsplit=1)[0]
            above = above.splitlines()
            comment = []
            while above and above[-1].strip().startswith("#:"):
                comment.append(above.pop())
            doc = "\n".join(comment)
        assert "Example" in doc, name


def _private_reads(source: str, names: set[str]) -> list[str]:
    """``x._name`` for a private member ``_name`` of a Lock, on anything but self/cls."""
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr in names
        and ast.unparse(node.value) not in ("self", "cls")
    ]


def test_no_module_outside_the_handle_reads_a_private_member_of_a_lock() -> None:
    """The watchdog, the backends and the testing kit use the handle's public seam
    (``hold_of(lock).valid_until``, ``.acquisition``, ``.renew()``, ...), never
    ``hold._valid_until``."""
    names = _private_names()
    assert {"_valid_until", "_acquisition", "_token", "_lost", "_mutex"} <= names
    root = Path(django_distlock.__file__).parent
    found = {
        str(path.relative_to(root)): reads
        for path in sorted(root.rglob("*.py"))
        if not (path.parent == root and path.name in HANDLE_MODULES)
        and (reads := _private_reads(path.read_text(), names))
    }
    assert found == {}


def test_the_private_read_check_can_fail() -> None:
    names = _private_names()
    source = "def f(lock, handle):\n    return lock._valid_until, handle._lost, self._token\n"
    assert _private_reads(source, names) == ["2: lock._valid_until", "2: handle._lost"]


# -- kind and limit at construction ------------------------------------------------


class _KindsBackend(LocMemBackend):
    """Builds read-write and semaphore handles (none is acquired here: no I/O)."""

    kinds = {kind: LocMemAcquisition for kind in Kind}


def test_kind_and_limit_are_given_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    """read_lock(), write_lock() and semaphore() pass kind and limit to Lock() itself:
    no handle is seen, even by its own __init__, as an exclusive lock first."""
    built: list[tuple[str, int | None]] = []

    class Recording(Lock):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            built.append((self.kind, self.options.limit))

    monkeypatch.setattr(base, "Lock", Recording)
    backend = _KindsBackend("kinds", {})
    handles = [
        backend.lock("a"),
        backend.read_lock("a"),
        backend.write_lock("a", ttl=5),
        backend.semaphore("a", 3, timeout=1),
    ]
    expected = [("exclusive", None), ("read", None), ("write", None), ("semaphore", 3)]
    assert built == expected
    assert [(handle.kind, handle.options.limit) for handle in handles] == expected
    assert handles[2].options.ttl == 5 and handles[3].options.timeout == 1


def test_lock_takes_kind_and_limit() -> None:
    handle = Lock(
        locks["locmem"], "n", "k", ttl=1, timeout=None, blocking=True,
        kind="semaphore", limit=2,
    )
    assert (handle.kind, handle.options.limit) == ("semaphore", 2)
    default = Lock(locks["locmem"], "n", "k", ttl=1, timeout=None, blocking=True)
    assert (default.kind, default.options.limit) == ("exclusive", None)


def test_self_deadlock_is_a_lock_not_acquired() -> None:
    from django_distlock import SelfDeadlock as from_package
    from django_distlock import exceptions

    assert from_package is exceptions.SelfDeadlock
    assert issubclass(exceptions.SelfDeadlock, LockNotAcquired)


# -- reentrant handles whose hold ended -------------------------------------------


def test_a_reentrant_handle_whose_lease_ran_out_says_so_until_released(unique) -> None:
    """Its next acquire raises LockLost (the critical sections it counted were not
    protected to their end), each counted acquisition's release raises LockLost, and
    the handle then acquires anew."""
    import time

    from django_distlock.exceptions import LockLost

    backend, name = locks["locmem"], unique()
    handle = backend.lock(name, ttl=0.05, reentrant=True)
    assert handle.acquire() and handle.acquire()
    time.sleep(0.1)
    assert handle.lost and not handle.held
    with pytest.raises(LockLost):
        handle.acquire(blocking=False)
    for _ in range(2):
        with pytest.raises(LockLost):
            handle.release()
    assert handle.acquire(blocking=False) and handle.held
    handle.release()


def test_a_second_handle_on_a_hold_that_ended_is_freed_by_its_releases(unique) -> None:
    """A second reentrant handle counted on the first's hold: once that lease ran out,
    its acquire raises LockLost, its release raises LockLost and frees it, and it then
    takes the name anew; the first's release raises LockLost and frees the name."""
    import time

    from django_distlock.exceptions import LockLost

    backend, name = locks["locmem"], unique()
    outer = backend.lock(name, ttl=0.05, reentrant=True)
    inner = backend.lock(name, ttl=30, reentrant=True)
    assert outer.acquire() and inner.acquire()
    assert hold_of(inner) is hold_of(outer)
    time.sleep(0.1)
    with pytest.raises(LockLost):
        inner.acquire(blocking=False)
    with pytest.raises(LockLost):
        inner.release()
    assert hold_of(inner) is not hold_of(outer)
    assert inner.acquire(blocking=False) and inner.held  # its own hold, a new grant
    inner.release()
    with pytest.raises(LockLost):
        outer.release()
    assert outer.acquire(blocking=False)
    outer.release()


def test_an_acquisition_that_cannot_be_built_fails_the_acquire_and_frees_the_handle(
    unique,
) -> None:
    """A backend whose acquisition raises as it is built (before any attempt) fails the
    acquire with its error, sends ``lock_acquire_failed``, and leaves the handle free to
    acquire again: not stuck as "being acquired"."""
    from django_distlock.exceptions import BackendUnavailable
    from django_distlock.testing.signals import signals_sent

    builds: list[int] = []

    class Unbuildable(LocMemAcquisition):
        def __init__(self, *args) -> None:
            builds.append(1)
            if len(builds) <= 2:  # the first acquire (both its builds) fails
                raise BackendUnavailable("the client could not be set up")
            super().__init__(*args)

    backend = LocMemBackend("unbuildable", {
        "BACKEND": "django_distlock.backends.locmem.LocMemBackend"})
    backend.kinds = {**backend.kinds, Kind.EXCLUSIVE: Unbuildable}
    name = unique()
    handle = backend.lock(name)
    with signals_sent("lock_acquire_failed", backend=backend) as sent, \
            pytest.raises(BackendUnavailable, match="could not be set up"):
        handle.acquire()
    assert sent == [("lock_acquire_failed", name)]
    assert handle.acquire()  # free again: the next acquire builds and is granted
    handle.release()
