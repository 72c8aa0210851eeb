"""The kazoo client of a ZooKeeper alias: one per process, started lazily, dropped in a
forked child, closed at exit; its session state passed on to the acquisitions."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import Create, Create2
from kazoo.security import ACL, Id, make_acl, make_digest_acl

from ...exceptions import BackendUnavailable, TooManyLocks
from .errors import ERRORS, ZOOKEEPER_ERRORS
from .options import ZooKeeperSettings
from .paths import guid_of

if TYPE_CHECKING:
    from kazoo.interfaces import IAsyncResult

logger = logging.getLogger("django_distlock")

_CONTAINER = 4  # CreateMode.CONTAINER's flag


class _CreateContainer(Create2):
    """``createContainer`` (ZooKeeper 3.5.3+): a node the server deletes once its last
    child is gone (kazoo's ``create()`` has no container mode)."""

    type = 19


class Watcher(Protocol):
    """What the client tells of its session (acquisitions that hold or wait)."""

    def session_changed(self, state: str) -> None: ...


class Client:
    """The lazily started ``KazooClient`` of one alias in this process."""

    def __init__(self, settings: ZooKeeperSettings) -> None:
        self.settings = settings
        self._mutex = threading.Lock()
        self._kazoo: KazooClient | None = None
        self._pid = os.getpid()
        self._root_ready = False
        self.watchers: weakref.WeakSet[Any] = weakref.WeakSet()
        #: (parent path, guid) of contender nodes whose deletion failed; deleted when the
        #: session is connected again (their session is alive, so they would block).
        self.orphans: set[tuple[str, str]] = set()
        #: Watch events delivered to waiters (tests count them: one per release).
        self.watch_events = 0
        #: Watch events on the contender a waiter's predecessor waits for (it lists again).
        self.ahead_events = 0
        #: The path bytes of the contender nodes each acquisition has in the session.
        self._claims: dict[Any, int] = {}
        self.claimed = 0
        self._claims_mutex = threading.Lock()
        self._claims_pid = os.getpid()
        self.acl: list[ACL] | None = self._acl()
        _clients.add(self)

    def _acl(self) -> list[ACL] | None:
        s = self.settings
        entries = []
        if s.auth is not None:
            entries.append(make_digest_acl(s.auth[0], s.auth[1], all=True))
        for scheme, ident, perms in s.acl:
            flags = {perm.lower(): True for perm in perms}
            entries.append(make_acl(scheme, ident, **flags))
        if entries and s.auth is None and not any(e.id.scheme == "world" for e in entries):
            entries.append(ACL(31, Id("world", "anyone")))  # ACL without auth: keep usable
        return entries or None

    # -- the client ---------------------------------------------------------

    def get(self) -> KazooClient:
        """The started client of this process (started on first use, again after a fork).

        :raises BackendUnavailable: when no server of the ensemble can be reached.
        """
        kazoo = self._kazoo
        if kazoo is not None and self._pid == os.getpid():
            return kazoo
        with self._mutex:
            if self._pid != os.getpid():
                # A forked child: the parent's client (its socket, threads, session) is
                # the parent's. Closing it here would end the parent's session.
                self._kazoo, self._pid, self._root_ready = None, os.getpid(), False
                self.orphans = set()
            if self._kazoo is None:
                self._kazoo = self._start()
            return self._kazoo

    def _start(self) -> KazooClient:
        s = self.settings
        auth = [("digest", f"{s.auth[0]}:{s.auth[1]}")] if s.auth else None
        kazoo = KazooClient(
            hosts=s.hosts, timeout=s.session_timeout, auth_data=auth, default_acl=self.acl,
            **s.client_options,
        )
        kazoo.add_listener(self._state_changed)
        # Not kazoo's start(): on a timeout it stops the client before raising, which
        # waits for a connection attempt in progress (seconds past the timeout).
        try:
            connected = kazoo.start_async().wait(timeout=s.connect_timeout)
        except ERRORS as exc:
            raise ZOOKEEPER_ERRORS.translate(exc, f"connecting to {s.hosts}") from exc
        if not connected or not kazoo.connected:
            threading.Thread(target=_discard, args=(kazoo,), daemon=True).start()
            timeout = KazooTimeoutError("Connection time-out")
            raise ZOOKEEPER_ERRORS.translate(timeout, f"connecting to {s.hosts}") from timeout
        return kazoo

    def connected(self) -> bool:
        """Whether this process' session is connected now (no I/O)."""
        kazoo = self._kazoo
        return kazoo is not None and self._pid == os.getpid() and kazoo.connected

    def await_connected(self, until: float) -> None:
        """Sleep until the session is connected again (kazoo reconnects by itself, with
        a new session after an expiry), or until ``until`` (a monotonic time)."""
        time.sleep(0.01)
        while not self.connected() and time.monotonic() < until:
            time.sleep(0.02)

    def close(self) -> None:
        """End this process' session (its ephemeral nodes go at once) and the client."""
        with self._mutex:
            kazoo, self._kazoo = self._kazoo, None
            self._root_ready = False
        if kazoo is not None and self._pid == os.getpid():
            try:
                kazoo.stop()
                kazoo.close()
            except ERRORS:
                logger.warning("Closing the ZooKeeper client failed", exc_info=True)

    # -- calls --------------------------------------------------------------------

    def wait(self, result: IAsyncResult, what: str, until: float | None = None) -> Any:
        """The value of an async kazoo call, within ``CONNECT_TIMEOUT`` (or by ``until``,
        a monotonic time, when it comes first).

        :raises NoNodeError, NodeExistsError, NotEmptyError, BadVersionError: for the
            caller to handle.
        :raises BackendUnavailable: for any other failure, and a call unanswered in time.
        """
        try:
            timeout = self.settings.connect_timeout
            if until is not None:
                timeout = max(min(timeout, until - time.monotonic()), 0.001)
            return result.get(timeout=timeout)
        except (NoNodeError, NodeExistsError, NotEmptyError, BadVersionError):
            raise
        except ERRORS as exc:
            raise ZOOKEEPER_ERRORS.translate(exc, what) from exc

    def call(
        self, what: str, method: str, *args: Any, until: float | None = None, **kwargs: Any
    ) -> Any:
        """Call ``kazoo.<method>_async(*args, **kwargs)`` and wait for it, by ``until`` or
        within ``CONNECT_TIMEOUT`` (see :meth:`wait`).

        A read (``get_children``, ``exists``, ``get``) cut by a connection loss is sent
        again until ``CONNECT_TIMEOUT`` has passed: kazoo reconnects to another server of
        the ensemble meanwhile, and the session (with its nodes) lives on; after a
        session expiry, kazoo opens a new session, and the read waits for it. Writes are
        not retried here: their callers know what a retry means.
        """
        retry = method in _READS
        if until is None:
            until = time.monotonic() + self.settings.connect_timeout
        while True:
            try:
                result = getattr(self.get(), method + "_async")(*args, **kwargs)
            except ERRORS as exc:
                raise ZOOKEEPER_ERRORS.translate(exc, what) from exc
            try:
                return self.wait(result, what, until)
            except BackendUnavailable as exc:
                if not (retry and isinstance(exc.__cause__, ConnectionLoss | SessionExpiredError)):
                    raise
                if time.monotonic() >= until:
                    raise
                self.await_connected(until)

    def create_parent(self, path: str) -> None:
        """Create the container node ``path``, and its missing ancestors (containers up
        to ``ROOT``, which is persistent).

        :raises BackendUnavailable: when the server fails.
        """
        for _ in range(3):
            try:
                self._create_container(path)
                return
            except NodeExistsError:
                return
            except NoNodeError:
                above = path.rsplit("/", 1)[0]
                if above == self.settings.root:
                    self._root_ready = False
                    self.ensure_root()
                else:
                    self.create_parent(above)
        raise BackendUnavailable(f"ZooKeeper kept removing the parents of {path}.")

    def _create_container(self, path: str) -> None:
        kazoo = self.get()
        result = kazoo.handler.async_result()
        # A request sent with kazoo's _call() is not given the chroot: the path is.
        full = f"{kazoo.chroot or ''}{path}"
        request = _CreateContainer(full, b"", self.acl or kazoo.default_acl or _OPEN, _CONTAINER)
        kazoo._call(request, result)  # no public container mode in kazoo (2.11)
        self.wait(result, f"creating {path}")

    def ensure_root(self) -> None:
        """Create ``ROOT`` (a persistent node) unless this session saw it, and the chroot
        of ``LOCATION`` when it is missing.

        :raises BackendUnavailable: when the server fails.
        """
        if self._root_ready:
            return
        for _ in range(3):
            try:
                self.call("creating the root", "create", self.settings.root, makepath=True,
                          acl=self.acl)
            except NodeExistsError:
                pass
            except NoNodeError:  # kazoo creates no node above the chroot
                self._create_chroot()
                continue
            self._root_ready = True
            return
        raise BackendUnavailable(
            f"ZooKeeper kept removing the chroot of {self.settings.hosts!r}."
        )

    def _create_chroot(self) -> None:
        """Create the chroot of ``LOCATION`` and its ancestors (persistent nodes), as
        Curator creates its namespace."""
        kazoo = self.get()
        path = ""
        for part in (kazoo.chroot or "").split("/")[1:]:
            path += f"/{part}"
            result = kazoo.handler.async_result()
            request = Create(path, b"", self.acl or kazoo.default_acl or _OPEN, 0)
            kazoo._call(request, result)  # above the chroot: kazoo's create() cannot
            with contextlib.suppress(NodeExistsError):
                self.wait(result, f"creating the chroot {path}")

    # -- session state -------------------------------------------------------------

    def _state_changed(self, state: str) -> None:
        """kazoo's listener (its event thread: must not block)."""
        if state == KazooState.LOST:
            self._root_ready = False
            with self._claims_mutex:  # the session's nodes are gone
                self._claims, self.claimed = {}, 0
        for watcher in list(self.watchers):
            try:
                watcher.session_changed(state)
            except Exception:
                logger.exception("Passing the ZooKeeper state %s on failed", state)
        if state == KazooState.CONNECTED and self.orphans:
            threading.Thread(target=self.sweep_orphans, daemon=True).start()

    # -- the session's size --------------------------------------------------------

    def claim(self, owner: Any, path: str) -> None:
        """Count the node ``owner`` is about to create at ``path`` (+ its sequence).

        :raises TooManyLocks: when the session's nodes would pass ``MAX_SESSION_BYTES``.
        """
        size = len(path.encode()) + _NODE_OVERHEAD
        with self._claims_mutex:
            if self._claims_pid != os.getpid():  # a forked child: its session is its own
                self._claims, self.claimed, self._claims_pid = {}, 0, os.getpid()
            if owner in self._claims:
                return
            if self.claimed + size > self.settings.max_session_bytes:
                raise TooManyLocks(
                    f"This process' ZooKeeper session already has {len(self._claims)} lock "
                    f"nodes ({self.claimed} bytes of paths); one more would pass "
                    f"MAX_SESSION_BYTES ({self.settings.max_session_bytes}). The end of a "
                    "session with too many nodes breaks the ensemble (ZOOKEEPER-4306): "
                    "release locks, or spread them over processes."
                )
            self._claims[owner] = size
            self.claimed += size

    def unclaim(self, owner: Any) -> None:
        """``owner``'s node is gone (or will be, with the session)."""
        with self._claims_mutex:
            self.claimed -= self._claims.pop(owner, 0)

    def sweep_orphans(self) -> None:
        """Delete the contender nodes whose deletion failed before (a reconnection)."""
        for parent, guid in list(self.orphans):
            try:
                delete_guid(self, parent, guid)
            except (BackendUnavailable, NoNodeError):
                continue
            self.orphans.discard((parent, guid))


_OPEN = [ACL(31, Id("world", "anyone"))]
#: A node's sequence suffix (10 digits) and the length prefix of its path in a transaction.
_NODE_OVERHEAD = 14
_READS = frozenset({"get_children", "exists", "get"})


def delete_guid(client: Client, parent: str, guid: str) -> bool:
    """Delete the contender nodes of ``guid`` under ``parent``; whether any was there.

    :raises BackendUnavailable: when the server fails.
    """
    try:
        children = client.call(f"listing {parent}", "get_children", parent)
    except NoNodeError:
        return False
    found = False
    for child in children:
        if guid_of(child) == guid:
            found = True
            with contextlib.suppress(NoNodeError):
                client.call(f"deleting {parent}/{child}", "delete", f"{parent}/{child}")
    return found


def _discard(kazoo: KazooClient) -> None:
    """Stop and close a client that never connected (in the background)."""
    with contextlib.suppress(*ERRORS):
        kazoo.stop()
        kazoo.close()


_clients: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close this process' sessions: their ephemeral nodes (held locks) go at once."""
    for client in list(_clients):
        client.close()


def on_done(result: IAsyncResult, callback: Callable[[IAsyncResult], None]) -> None:
    """Call ``callback(result)`` in kazoo's thread once the call completes."""
    result.rawlink(callback)
