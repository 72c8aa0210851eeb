"""Faults for tests of code that takes locks: a lock taken away from its holder, and a
lock server that cannot be reached. Both act on the real backend; nothing is mocked."""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

from django.utils.module_loading import import_string

from ..backends.base import BaseLockBackend
from ..exceptions import LockNotHeld, UnsupportedOperation

__all__ = ["backend_unavailable", "expire_session", "make_lost"]


def make_lost(handle: Any) -> None:
    """Take the lock away from ``handle``, its holder, as an operator or a lease's end would.

    Calls the backend's public ``force_release(name, owner=handle.owner_id)``: the
    lock is freed on the server only while this holder has it, and another owner
    may take it at once. Where the server keeps no owner per grant (MySQL session mode:
    ``supports_force_release_by_owner`` False) it calls ``force_release(name)``, which
    ends the holder's session: the handle's, since it holds the lock. The handle is not
    told (no I/O reaches it): like a holder whose lease ended during a pause, it finds
    out at its next ``extend()`` or ``release()`` (the ``with`` exit), which raise
    :class:`~django_distlock.exceptions.LockLost` (a ZooKeeper holder too: its node
    is not watched while held; only the end of its session tells it at once).

    :param handle: a :class:`~django_distlock.handle.Lock` that holds its lock.
    :raises LockNotHeld: when ``handle`` holds nothing.
    :raises UnsupportedOperation: when the backend cannot free another owner's lock
        (database transaction mode: the lock lives as long as the holder's
        transaction; end that, or kill the holder's process).
    :raises AssertionError: when the server says this holder did not have the lock.
    :raises BackendUnavailable: when the server fails.
    """
    if not handle.held:
        raise LockNotHeld(f"{handle!r} holds nothing to lose.")
    backend = handle.backend
    if not backend.supports_force_release:
        raise UnsupportedOperation(
            f"{type(backend).__name__} (alias {backend.alias!r}) cannot take a lock from its "
            "holder: the lock ends with the holder's transaction or process. Test the loss "
            "by ending that (e.g. hold_elsewhere(...).kill())."
        )
    owner = handle.owner_id if backend.supports_force_release_by_owner else None
    if not backend.force_release(handle.name, owner=owner):
        raise AssertionError(f"The backend says {handle!r} did not hold its lock any more.")


def expire_session(using: str = "default", timeout: float = 10) -> None:
    """End this process' ZooKeeper session of ``using`` on the servers, as a network
    partition longer than the session timeout would.

    Done on the servers, as the ZooKeeper FAQ describes (kazoo's harness instead
    feeds a fake expiry to its client): a second client joins the session with its id
    and password and closes it. Every lock the process holds on
    the alias is then lost: this returns once the process' client has heard of it
    (its handles are ``lost``, their ``release()`` raises
    :class:`~django_distlock.exceptions.LockLost`); the backend opens a new session
    for the next call.

    :param using: a ZooKeeper lock alias.
    :param timeout: seconds to wait for each step.
    :raises UnsupportedOperation: for a backend other than ZooKeeper.
    :raises AssertionError: when the client did not see its session end in time.
    :raises BackendUnavailable: when the ensemble cannot be reached.
    """
    import threading

    from kazoo.client import KazooClient, KazooState

    from ..handler import locks

    backend = locks[using]
    if not _is(backend, "zookeeper"):
        raise UnsupportedOperation(
            f"expire_session() ends ZooKeeper sessions; {type(backend).__name__} (alias "
            f"{using!r}) has none. Use make_lost(handle) to take one lock away."
        )
    kazoo = backend.client.get()  # type: ignore[attr-defined]
    ended = threading.Event()

    def listen(state: str) -> bool:
        if state == KazooState.LOST:
            ended.set()
            return True  # kazoo drops a listener that returns True
        return False

    kazoo.add_listener(listen)
    twin = KazooClient(
        hosts=backend.settings.hosts,  # type: ignore[attr-defined]
        client_id=kazoo.client_id,
    )
    try:
        twin.start(timeout=timeout)
        twin.stop()
    finally:
        twin.close()
    if not ended.wait(timeout):
        kazoo.remove_listener(listen)
        raise AssertionError(f"The ZooKeeper client of {using!r} did not lose its session.")


def _closed_port(stack: ExitStack) -> int:
    """A local TCP port that refuses connections for as long as ``stack`` is open: bound
    (so nobody else takes it) and never listening."""
    sock = stack.enter_context(socket.socket())
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    return port


def _is(backend: BaseLockBackend, package: str, name: str | None = None) -> bool:
    """Whether ``backend``'s class or a base comes from ``package`` (named ``name``)."""
    return any(
        cls.__module__.startswith(f"django_distlock.backends.{package}")
        and (name is None or cls.__name__ == name)
        for cls in type(backend).__mro__
    )


def _unreachable_database(database: str, stack: ExitStack) -> None:
    """Point the database alias ``database`` at a server that cannot be reached, in
    this thread's connection and in the settings new connections are made from
    (PostgreSQL: a refusing port; SQLite: a file in a missing directory), until
    ``stack`` closes.

    :raises UnsupportedOperation: inside an atomic block (the connection cannot be cut).
    """
    from django.conf import settings
    from django.db import connections

    wrapper = connections[database]
    if wrapper.in_atomic_block:
        raise UnsupportedOperation(
            f"backend_unavailable() cannot cut database {database!r} inside a transaction "
            "(django.test.TestCase wraps each test in one): use a TransactionTestCase "
            "(pytest-django: django_db(transaction=True))."
        )
    real = wrapper.settings_dict
    broken = dict(real)
    if wrapper.vendor == "sqlite":
        missing = os.path.join(tempfile.gettempdir(), f"distlock-gone-{secrets.token_hex(6)}")
        broken["NAME"] = os.path.join(missing, "db.sqlite3")
    else:
        broken["HOST"], broken["PORT"] = "127.0.0.1", str(_closed_port(stack))
    registries = [settings.DATABASES]
    if connections.settings is not settings.DATABASES:
        registries.append(connections.settings)
    originals = [registry[database] for registry in registries]

    def point(settings_dict: dict[str, Any], entries: list[Any]) -> None:
        wrapper.close()
        wrapper.settings_dict = settings_dict
        for registry, entry in zip(registries, entries, strict=True):
            registry[database] = entry

    point(broken, [broken] * len(registries))
    stack.callback(point, real, originals)


def unreachable_params(
    backend: BaseLockBackend, params: Mapping[str, Any], stack: ExitStack
) -> dict[str, Any]:
    """The settings of ``backend``'s alias with its server swapped for one that cannot be
    reached (valid until ``stack`` closes).

    :raises UnsupportedOperation: for a process-local or unknown backend.
    """
    new = dict(params)
    options = dict(params.get("OPTIONS", {}))
    if _is(backend, "database"):
        _unreachable_database(backend.database, stack)  # type: ignore[attr-defined]
    elif _is(backend, "redis", "RedlockBackend"):
        new["LOCATION"] = [
            f"redis://127.0.0.1:{_closed_port(stack)}/0" for _ in params["LOCATION"]
        ]
    elif _is(backend, "redis"):
        options.pop("CACHE", None)
        new["LOCATION"] = f"redis://127.0.0.1:{_closed_port(stack)}/0"
    elif _is(backend, "zookeeper"):
        new["LOCATION"] = f"127.0.0.1:{_closed_port(stack)}"
        options["CONNECT_TIMEOUT"] = min(float(options.get("CONNECT_TIMEOUT", 1)), 1.0)
    else:
        what = "locks live in this process" if not backend.distributed else "server is unknown"
        raise UnsupportedOperation(
            f"backend_unavailable() cannot cut {type(backend).__name__} (alias "
            f"{backend.alias!r}) from its server: its {what}."
        )
    new["OPTIONS"] = options
    return new


@contextmanager
def backend_unavailable(using: str = "default") -> Iterator[BaseLockBackend]:
    """``with backend_unavailable("default"):`` — the alias' lock server is down in the block.

    What is simulated: a server that refuses connections. For the block, ``locks[using]``
    is a new backend of the alias' own class and settings, except that its server is
    one that cannot be reached: a local port that refuses connections (Redis, every
    Redlock master, ZooKeeper with a connect timeout of at most 1 s). Every call
    through it (``acquire()``, ``with``, ``@distlock``, ``is_locked()``,
    ``health()``...) therefore fails in the backend's own client and raises
    :class:`~django_distlock.exceptions.BackendUnavailable` chained to the client's
    error, as in production.

    On the database backend the lock server *is* the database: the alias' database
    (``OPTIONS["DATABASE"]``) is pointed at a refusing port (PostgreSQL) or at a file
    in a missing directory (SQLite), in this thread's Django connection (closed
    first, reopened after) and in the settings new connections are made from. ORM
    queries on that database in the block fail too, as they would. The test must not
    be inside a transaction then (``TransactionTestCase``; pytest-django:
    ``django_db(transaction=True)``).

    Handles built before the block keep the real backend (a lease held on its own
    sessions stays held); after the block, ``locks[using]`` is the real backend again
    and works. This process only: a :func:`~django_distlock.testing.hold_elsewhere`
    holder or another worker still reaches the server.

    :param using: the lock alias.
    :returns: the unreachable backend, as the ``with`` target.
    :raises UnsupportedOperation: for a process-local backend (``locmem``: there is
        no server), a third-party backend this helper does not know, or a database
        backend inside an atomic block.
    """
    from ..handler import locks

    real = locks[using]
    with ExitStack() as stack:
        params = unreachable_params(real, locks.settings[using], stack)
        broken: BaseLockBackend = import_string(params["BACKEND"])(using, params)
        stack.callback(broken.close)
        locks[using] = broken
        try:
            yield broken
        finally:
            if locks[using] is broken:  # (not if the block changed DISTLOCK: rebuilt then)
                locks[using] = real
