"""Hold a lock from another OS process, for tests of code that must cope with a busy lock.

:func:`hold_elsewhere` forks a child process of the test process: the child
has the same settings (``override_settings`` included) and the same test
databases, opens connections of its own, acquires the lock on the real backend
and keeps it until the block ends. Nothing is mocked: the test process sees the
lock held exactly as it would see another machine's worker holding it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import warnings
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from ..exceptions import DistLockError, UnsupportedOperation

__all__ = ["Elsewhere", "hold_elsewhere", "run_in_processes"]

#: Django connection wrappers a forked child inherited: kept referenced and never
#: closed, since closing (or collecting) one would end the parent's session on it.
_inherited: list[Any] = []


@dataclass
class Elsewhere:
    """The lock held by the child process of :func:`hold_elsewhere`."""

    #: The lock's name and alias.
    name: str
    using: str
    #: The child's pid.
    pid: int
    #: The grant's short owner id (as listings show it) and fencing token.
    owner_id: str | None
    fencing_token: int | None
    _process: Any = field(repr=False)
    _pipe: Connection = field(repr=False)

    def __enter__(self) -> Elsewhere:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    @property
    def alive(self) -> bool:
        """Whether the child process still runs."""
        return bool(self._process.is_alive())

    def kill(self) -> None:
        """SIGKILL the holder, as a crash would (it releases nothing): the lock stays held
        until the backend notices (its lease ends, its session or transaction ends)."""
        if self._process.is_alive():
            os.kill(self.pid, signal.SIGKILL)
        self._process.join(10)

    def release(self, timeout: float = 10) -> None:
        """Make the holder release the lock and exit; returns once it has released.

        :param timeout: seconds to wait for it (then it is killed).
        :raises AssertionError: when the holder's release failed or took too long (the
            holder is killed then).
        """
        if not self._process.is_alive():
            self._process.join(10)
            self._pipe.close()
            return
        problem = None
        try:
            self._pipe.send("release")
            if not self._pipe.poll(timeout):
                problem = f"did not release {self.name!r} within {timeout} s"
            else:
                answer = self._pipe.recv()
                if answer[0] != "released":
                    problem = f"failed to release {self.name!r}: {answer[1]}"
        except (EOFError, OSError) as exc:
            problem = f"died before releasing {self.name!r}: {exc!r}"
        self._process.join(timeout)
        if self._process.is_alive():
            self.kill()
        self._pipe.close()
        if problem:
            raise AssertionError(f"The holder process {self.pid} {problem}.")


def _fork(target: Any, args: tuple[Any, ...], name: str | None = None) -> Any:
    """Start a forked child running ``target(*args)``. Python 3.12+ warns about forking a
    process with threads; the child here rebuilds what it uses (its own connections, its
    own lock backends), so the warning is silenced for this one fork."""
    process = multiprocessing.get_context("fork").Process(
        target=target, args=args, daemon=True, name=name
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
        process.start()
    return process


def _refuse_sqlite_in_transaction(backend: Any) -> None:
    """A database backend on SQLite under this thread's open transaction: the child
    would wait for the database's write lock that this process holds."""
    database = getattr(backend, "database", None)
    if database is None:
        return
    from django.db import connections

    connection = connections[database]
    if connection.vendor == "sqlite" and connection.in_atomic_block:
        raise UnsupportedOperation(
            f"Another process cannot take a lock in SQLite database {database!r} while this "
            "test's transaction holds its write lock: use a TransactionTestCase "
            "(pytest-django: django_db(transaction=True))."
        )


def _fresh_django_connections() -> None:
    """In the child: leave the parent's Django connections alone (never close them, they
    are the parent's sessions too) and open new ones on first use."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        _inherited.append(conn)
        connections[conn.alias] = connections.create_connection(conn.alias)


def _hold(using: str, name: str, ttl: float, timeout: float, pipe: Connection) -> None:
    """The child: acquire, report, wait for the parent's word (or its death), release."""
    from ..handler import locks

    _fresh_django_connections()
    try:
        handle = locks[using].lock(name, ttl=ttl, timeout=timeout)
        if not handle.acquire():
            pipe.send(("error", f"{name!r} stayed held by someone else for {timeout} s"))
            return
    except BaseException as exc:
        pipe.send(("error", repr(exc)))
        return
    pipe.send(("held", handle.owner_id, handle.fencing_token))
    with contextlib.suppress(EOFError):  # EOF: the parent died; let go all the same
        pipe.recv()
    try:
        handle.release()
        answer: tuple[str, ...] = ("released",)
    except DistLockError as exc:
        answer = ("error", repr(exc))
    finally:
        locks.close_all()
    with contextlib.suppress(OSError):
        pipe.send(answer)


def hold_elsewhere(
    name: str, using: str = "default", ttl: float = 60, timeout: float = 10
) -> Elsewhere:
    """``with hold_elsewhere("stock:42"):`` — another OS process holds the lock in the block.

    A forked child of this process (same settings, same test databases, connections
    of its own) acquires ``name`` on the real backend of ``using``; the call returns
    once it holds it, and the ``with`` exit makes it release it (it is killed if it
    cannot). Without ``with``, call :meth:`Elsewhere.release` yourself.
    :meth:`Elsewhere.kill` simulates a crashed holder.

    On the database backend with SQLite, the test must not hold the database's
    write lock itself: use a ``TransactionTestCase`` (pytest-django:
    ``django_db(transaction=True)``), as for any test with several processes.

    :param name: the lock name.
    :param using: the lock alias.
    :param ttl: the holder's lease in seconds (backends whose locks expire).
    :param timeout: how long the child waits for the lock if someone holds it.
    :returns: the :class:`Elsewhere` holder (a context manager releasing it).
    :raises UnsupportedOperation: for a process-local backend (``locmem``), or SQLite
        inside a transaction of this thread.
    :raises AssertionError: when the child could not take the lock.
    """
    from ..handler import locks

    backend = locks[using]
    if not backend.distributed:
        raise UnsupportedOperation(
            f"DISTLOCK[{using!r}] is {type(backend).__name__}, whose locks live in one "
            "process: no other process can hold them. Test with a backend shared by "
            "processes (the database, Redis, ZooKeeper), or hold the lock in a thread."
        )
    _refuse_sqlite_in_transaction(backend)
    ours, theirs = multiprocessing.Pipe()
    process = _fork(_hold, (using, name, ttl, timeout, theirs), f"distlock-holder:{name}")
    theirs.close()
    pid = process.pid or 0
    answer: tuple[Any, ...] = ("error", "exited without a word")
    if ours.poll(timeout + 30):
        with contextlib.suppress(EOFError):
            answer = ours.recv()
    else:
        answer = ("error", f"did not take the lock within {timeout + 30} s")
    if answer[0] != "held":
        process.kill()
        process.join(10)
        ours.close()
        raise AssertionError(
            f"The holder process {pid} could not take {name!r} on {using!r}: {answer[1]}"
        )
    return Elsewhere(name, using, pid, answer[1], answer[2], process, ours)


def _run(func: Any, args: tuple[Any, ...]) -> None:
    """A worker of :func:`run_in_processes`: fresh connections, ``func``, close them."""
    from django.db import connections

    from ..handler import locks

    _fresh_django_connections()
    try:
        func(*args)
    finally:
        locks.close_all()
        connections.close_all()


def run_in_processes(func: Any, *args: Any, processes: int = 4, timeout: float = 120) -> None:
    """Run ``func(*args)`` in ``processes`` forked processes at once and wait for them all:
    the concurrency your code meets with several web or task workers.

    Each child has this process' settings and test databases, and connections of its
    own. Record what they do with a shared
    :class:`~django_distlock.testing.checked.CheckedHistory` (``distlock_history``) and
    check it afterwards. As with :func:`hold_elsewhere`, use a ``TransactionTestCase``
    (``django_db(transaction=True)``) so that the children see the test's data.

    :param func: a function (it runs in the children: its return value is dropped).
    :param processes: how many children.
    :param timeout: seconds to wait for them all; a child still running is killed.
    :raises AssertionError: when a child raised (its traceback is on stderr), was
        killed, or outran ``timeout``.
    """
    children = [_fork(_run, (func, args)) for _ in range(processes)]
    for child in children:
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join(10)
    failed = {child.pid: child.exitcode for child in children if child.exitcode != 0}
    if failed:
        raise AssertionError(f"Worker processes failed (pid: exit code): {failed}.")
