"""What the contract's checks share: threads, a holder elsewhere, unique names, an
assertion of a raised exception and a record of calls that would do I/O. No pytest."""

from __future__ import annotations

import contextlib
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connections

from ...backends.base import BaseLockBackend
from ...handle import Lock
from ..signals import signals_sent

BAD_NAMES = ["", "a\x00b", "line\nbreak", "tab\there", "del\x7f", "\ud800"]
BAD_TYPES = [None, 42, b"bytes", ["a"], 1.5]
ODD_NAMES = ["a/b", "a/../b", "..", "/", "/etc/passwd", "spaces and ünïcode ✓", "%s'; --"]
#: Every capability flag a backend declares (as class attributes, each a bool).
FLAGS = (
    "supports_fencing", "supports_expiry", "supports_listing", "supports_force_release",
    "distributed", "supports_shared_owner", "supports_read_write", "supports_semaphore",
    "supports_waiters", "supports_counting", "supports_downgrade", "supports_age_order",
    "leases_join_transaction", "supports_leadership", "supports_force_release_by_owner",
)
#: The backend's methods that reach its server: none may run for a refused call.
IO_ENTRY_POINTS = (
    "_held_locks", "_count_held", "_force_release", "_waiters", "_held_locks_by_age",
    "acquisition", "is_locked", "health",
)


def in_thread(func: Callable[[], Any], timeout: float = 60) -> Any:
    """Run ``func`` in a new thread (its own connections) and return its result.

    :param func: what to run.
    :param timeout: the longest the thread may take, in seconds.
    :returns: what ``func`` returned.
    :raises AssertionError: when the thread did not finish in time.
    :raises BaseException: what ``func`` raised.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = func()
        except BaseException as exc:
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the thread did not finish"
    if "error" in box:
        raise box["error"]
    return box.get("result")


@contextlib.contextmanager
def held_elsewhere(make: Callable[[], Lock]) -> Iterator[bool]:
    """Have another thread build a handle with ``make`` and try it without waiting; yield
    whether it got the lock, which it holds until the block ends.

    :param make: builds the handle (in the other thread).
    :returns: a context manager yielding whether the other thread holds the lock.
    """
    got: list[bool] = []
    ready, done = threading.Event(), threading.Event()

    def hold() -> None:
        handle = make()
        try:
            got.append(handle.acquire(blocking=False))
        finally:
            ready.set()
        done.wait(60)
        if got[0]:
            handle.release()

    thread = threading.Thread(target=lambda: in_thread(hold, timeout=90))
    thread.start()
    try:
        assert ready.wait(60), "the other thread did not try the lock"
        yield bool(got and got[0])
    finally:
        done.set()
        thread.join(90)


@contextlib.contextmanager
def raises(expected: type[BaseException] | tuple[type[BaseException], ...],
           match: str | None = None) -> Iterator[None]:
    """Assert that the block raises ``expected`` (like ``pytest.raises``, without pytest).

    :param expected: the exception class (or classes).
    :param match: a regular expression the message must contain.
    :raises AssertionError: when the block raised nothing or the message does not match.
    """
    try:
        yield
    except expected as exc:
        if match is not None and not re.search(match, str(exc)):
            raise AssertionError(f"{exc!r} does not match {match!r}") from exc
        return
    raise AssertionError(f"the block did not raise {expected!r}")


@contextlib.contextmanager
def io_calls(backend: BaseLockBackend) -> Iterator[list[str]]:
    """Record, in the yielded list, the calls of the backend's methods that reach its
    server (:data:`IO_ENTRY_POINTS`) made inside the block.

    :param backend: the backend to watch (its instance, for the block only).
    :returns: a context manager yielding the names of the methods called, in order.
    """
    calls: list[str] = []
    for name in IO_ENTRY_POINTS:
        real = getattr(backend, name)

        def record(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls.append(_name)
            return _real(*args, **kwargs)

        setattr(backend, name, record)
    try:
        yield calls
    finally:
        for name in IO_ENTRY_POINTS:
            vars(backend).pop(name, None)


class ContractBase:
    """What the checks use on ``self``: names unique to one test (one instance per test,
    in pytest and in unittest) and a record of the lock signals."""

    _tag: str | None = None

    def unique(self, name: str = "lock") -> str:
        """Return ``name`` with a tag of this test appended.

        :param name: the readable part.
        :returns: a name no other test uses.
        """
        if self._tag is None:
            self._tag = uuid.uuid4().hex[:8]
        return f"{name}:{self._tag}"

    def events(
        self, backend: BaseLockBackend
    ) -> contextlib.AbstractContextManager[list[tuple[str, str]]]:
        """Record the lock signals sent for ``backend`` in the block, as (signal, name).

        :param backend: whose signals to record.
        :returns: a context manager yielding the list it fills.
        """
        return signals_sent(
            "lock_acquired", "lock_released", "lock_lost", "lock_force_released",
            backend=backend,
        )


def acquire_release(backend: BaseLockBackend, name: str) -> bool:
    """Take ``name`` (waiting up to 5 s) and give it back; return whether it was taken."""
    handle = backend.lock(name)
    got = handle.acquire(timeout=5)
    if got:
        handle.release()
    return got


def token_of_one_grant(backend: BaseLockBackend, name: str) -> int | None:
    """The fencing token of one grant of ``name``."""
    with backend.lock(name, timeout=5) as handle:
        return handle.fencing_token


def close_async_connections() -> None:
    """Close the connections the event loop's worker thread opened: outside
    ``async_to_sync`` (``asyncio.run``), asgiref runs thread-sensitive sync calls on its
    one executor thread, whose Django connections stay open after the loop ends (past
    the test database's teardown). ``async_to_sync(sync_to_async(...))`` would run in
    this thread instead, and close this thread's."""
    from asgiref.sync import SyncToAsync

    SyncToAsync.single_thread_executor.submit(connections.close_all).result()
