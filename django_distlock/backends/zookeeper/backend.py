"""The ZooKeeper lock backend: settings, listing, force release, health, checks."""

from __future__ import annotations

import contextlib
import heapq
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.core import checks
from kazoo.exceptions import NoNodeError

from ...exceptions import InvalidBackendOptions
from ...kinds import Kind
from ..base import (
    BaseLockBackend,
    Freed,
    HeldCount,
    LockInfo,
    LockPage,
    WaiterInfo,
)
from ..shared_reads import read_once
from .acquisition import (
    ZooKeeperAcquisition,
    ZooKeeperReadAcquisition,
    ZooKeeperWriteAcquisition,
)
from .client import Client
from .errors import ZOOKEEPER_ERRORS
from .options import parse
from .paths import GATE, LEASE_MARKER, contenders, decode, encode, holders
from .semaphore import SemaphoreAcquisition

_PARENTS_CACHE = 4096


def _fields(data: bytes) -> list[str]:
    """A contender node's data (see ``acquisition.holder_data``): version, kind, owner id,
    pid, host, thread."""
    fields = data.decode(errors="replace").split(" ", 5)
    return [*fields, "", "", "", "", "", ""][:6]


#: The most lock parents whose contenders one ``count_held()`` reads (see its docstring).
COUNT_READS = 200


class ZooKeeperBackend(BaseLockBackend):
    """Locks in a ZooKeeper ensemble, through kazoo (``docs/zookeeper.md``).

    ``LOCATION`` is the ensemble's hosts string (``"zk1:2181,zk2:2181,zk3:2181"``,
    an optional ``/chroot`` last). ``OPTIONS``: ``ROOT`` (the node under which
    locks live, default ``/django-distlock``), ``SESSION_TIMEOUT`` (seconds, default
    10: how long after a holder's crash its locks are freed), ``CONNECT_TIMEOUT``
    (the longest a call waits for an answer, default the session timeout),
    ``AUTH`` ((username, password): digest auth, and the nodes created get an ACL
    that gives that user all rights and nobody else any), ``ACL`` (more
    ``(scheme, id, perms)`` entries), ``CLIENT_OPTIONS`` (more ``KazooClient``
    keyword arguments).

    Locks are fair (first come, first served) and are held until released or
    until the holder's session ends; ``ttl`` is not used (``supports_expiry``
    is False) and ``extend()`` only checks that the lock is still held.
    """

    kinds = {
        Kind.EXCLUSIVE: ZooKeeperAcquisition,
        Kind.READ: ZooKeeperReadAcquisition,
        Kind.WRITE: ZooKeeperWriteAcquisition,
        Kind.SEMAPHORE: SemaphoreAcquisition,
    }
    errors = ZOOKEEPER_ERRORS
    distributed = True
    supports_fencing = True
    # A term learns of a suspended session (kazoo's SUSPENDED) before the ensemble can
    # expire it and hand the name to another (a third of SESSION_TIMEOUT at least).
    supports_leadership = True
    supports_listing = True
    supports_counting = True
    supports_force_release = True
    supports_force_release_by_owner = True
    supports_downgrade = True
    why_unsupported = {
        "supports_expiry": "a lock lives as long as its holder's session (ended "
        "SESSION_TIMEOUT after a crash); `ttl` is not used",
        "supports_shared_owner": "a node belongs to one process' session: only the "
        "reentrant handles of one thread or task share a hold",
    }
    supports_waiters = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings = parse(alias, self.location, self.options)
        self.client = Client(self.settings)
        #: The write locks this process holds, by parent path (their holders may take
        #: the read side at once: a downgrade).
        self.writers: dict[str, ZooKeeperAcquisition] = {}
        self._parents: dict[str, str] = {}
        #: (semaphore node, limit) -> the node's mzxid when this process found that limit
        #: stored there: later acquisitions skip reading it again.
        self.checked_limits: dict[tuple[str, int], int] = {}

    def parent_of(self, key: str) -> str:
        """The path of the parent node of the lock with storage key ``key`` (memoised)."""
        parent = self._parents.get(key)
        if parent is None:
            if len(self._parents) >= _PARENTS_CACHE:
                self._parents.clear()
            parent = self._parents[key] = f"{self.settings.root}/{encode(key)}"
        return parent

    def remember_limit(self, parent: str, limit: int, mzxid: int) -> None:
        """Note that the semaphore node ``parent`` had ``limit`` stored at ``mzxid``."""
        if len(self.checked_limits) >= _PARENTS_CACHE:
            self.checked_limits.clear()
        self.checked_limits[parent, limit] = mzxid

    def usable(self) -> None:
        """Refuse, before any server call, what the system checks report."""
        if self.settings.problems:
            raise InvalidBackendOptions(self.settings.problems[0].message)

    # -- the contract -----------------------------------------------------------

    def _contenders(self, parent: str) -> list[str]:
        try:
            return contenders(self.client.call(f"listing {parent}", "get_children", parent))
        except NoNodeError:
            return []

    def is_locked(self, name: str) -> bool:
        parent = self.parent_of(self.make_key(name))
        self.usable()
        return bool(self._contenders(parent))

    def _parent_names(self) -> list[str]:
        """The names of every lock parent under ``ROOT`` (one round trip), read once per
        :func:`~django_distlock.backends.shared_reads.shared_reads` block: the admin's
        page and its count read them once per view."""

        def read() -> list[str]:
            try:
                names = self.client.call("listing the root", "get_children", self.settings.root)
            except NoNodeError:
                return []
            return list(names)

        return read_once(("zookeeper lock parents", self), read)

    def _held_locks(self, prefix: str, limit: int, cursor: str | None) -> LockPage:
        """One page of held locks. ZooKeeper lists a node's children whole and unsorted,
        so this reads the names of every lock parent under ``ROOT`` (:meth:`_parent_names`),
        then only the page's parents and holders, a batch of async calls at a time."""
        self.usable()
        names = self._parent_names()
        low = self.key_prefix + prefix
        after = decode(cursor) if cursor is not None else None
        matched = [
            key for key in map(decode, names)
            if key.startswith(low) and (after is None or key > after)
        ]
        # The page's first parents without sorting them all (half the CPU of a page at
        # 100,000 parents); all of them sorted only when some of those hold no lock.
        keys = heapq.nsmallest(limit, matched)
        found: list[tuple[str, LockInfo]] = []
        start = 0
        while start < len(keys) and len(found) < limit:
            batch = keys[start : start + limit - len(found)]
            start += len(batch)
            found.extend(self._infos(batch))
            if start == len(keys) < len(matched) and len(found) < limit:
                keys = sorted(matched)
        # More parents left unread: the next page starts after the last one read.
        next_cursor = encode(keys[start - 1]) if start < len(matched) else None
        return LockPage([info for _, info in found], next_cursor)

    def _count_held(self, prefix: str, limit: int) -> HeldCount:
        """The root's children (:meth:`_parent_names`) are the lock parents: each held lock
        has one, and an empty parent is deleted by the ensemble within a minute (a
        container node), so their number is a ceiling. Each parent's contenders are
        read, as async calls sent together, for at most :data:`COUNT_READS` parents
        (about 0.2 ms each): past that the count is "at least" those found held, "at
        most" the parents."""
        self.usable()
        names = self._parent_names()
        low = self.key_prefix + prefix
        keys = [key for key in map(decode, names) if key.startswith(low)]
        kazoo, found = self.client.get(), 0
        read = heapq.nsmallest(min(COUNT_READS, limit + 1), keys)
        for result in [kazoo.get_children_async(self.parent_of(key)) for key in read]:
            with contextlib.suppress(NoNodeError):
                found += bool(contenders(self.client.wait(result, "counting locks")))
        if len(read) == len(keys) and found <= limit:
            return HeldCount(found, True)
        return HeldCount(min(found, limit), False, None if found > limit else len(keys))

    def _infos(self, keys: list[str]) -> list[tuple[str, LockInfo]]:
        """The held locks among ``keys``: their children, then their holders' nodes,
        each step one batch of calls sent together (one round trip's wait)."""
        kazoo = self.client.get()
        parents = [self.parent_of(key) for key in keys]
        listed = [kazoo.get_children_async(parent) for parent in parents]
        queues: list[tuple[str, str, list[str]]] = []
        for key, parent, result in zip(keys, parents, listed, strict=True):
            try:
                queue = contenders(self.client.wait(result, f"listing {parent}"))
            except NoNodeError:
                continue
            if queue:
                queues.append((key, parent, queue))
        reads = [kazoo.get_async(f"{parent}/{queue[0]}") for _, parent, queue in queues]
        infos = []
        for (key, _parent, queue), result in zip(queues, reads, strict=True):
            try:
                data, stat = self.client.wait(result, "reading a holder")
            except NoNodeError:
                continue  # released meanwhile
            waiting = len(queue) - len(holders(queue))
            if LEASE_MARKER in queue[0]:  # a semaphore's waiters queue at its gate
                waiting = len(self._contenders(f"{self.parent_of(key)}/{GATE}"))
            infos.append((key, self._info(key, data, stat, waiting)))
        return infos

    def _info(self, key: str, data: bytes, stat: Any, waiters: int) -> LockInfo:
        _version, kind, owner, pid, host, thread = _fields(data)
        return LockInfo(
            alias=self.alias,
            name=self.name_of(key),
            owner=owner,
            fencing_token=stat.czxid,
            acquired_at=datetime.fromtimestamp(stat.created, UTC),
            expires_at=None,
            host=host,
            pid=int(pid) if pid.isdigit() else None,
            thread=thread,
            waiters=waiters,
            kind=kind or "exclusive",
        )

    def _waiters(self, key: str, limit: int) -> list[WaiterInfo]:
        """The contenders after the holders (a semaphore's: those at its gate), their
        nodes read in one batch. ZooKeeper lists children whole: the listing's cost
        grows with the contenders, the reads with ``limit``."""
        self.usable()
        parent = self.parent_of(key)
        queue = self._contenders(parent)
        if queue and LEASE_MARKER in queue[0]:
            parent = f"{parent}/{GATE}"
            waiting = self._contenders(parent)
        else:
            waiting = queue[len(holders(queue)) :]
        kazoo = self.client.get()
        reads = [(node, kazoo.get_async(f"{parent}/{node}")) for node in waiting[:limit]]
        found: list[WaiterInfo] = []
        for node, result in reads:
            try:
                data, stat = self.client.wait(result, "reading a waiter")
            except NoNodeError:
                continue  # it gave up or got the lock meanwhile
            _version, kind, owner, pid, host, thread = _fields(data)
            found.append(WaiterInfo(
                position=len(found) + 1, owner=owner,
                since=datetime.fromtimestamp(stat.created, UTC), host=host,
                pid=int(pid) if pid.isdigit() else None, thread=thread,
                kind=kind or "exclusive", session=node,
            ))
        return found

    def _force_release(self, key: str, owner: str) -> Freed | None:
        parent = self.parent_of(key)
        self.usable()
        queue = self._contenders(parent)
        if not queue:
            return None
        # A contender's node is never re-created under its path: the holder read here
        # is the one deleted.
        path = f"{parent}/{queue[0]}"
        try:
            data, stat = self.client.call("reading the holder", "get", path)
            if owner and _fields(data)[2] != owner:
                return None
            self.client.call("deleting the holder", "delete", path)
        except NoNodeError:
            return None
        return Freed(stat.czxid)

    def health(self) -> float:
        self.usable()
        self.client.get()
        started = time.monotonic()
        self.client.call("checking health", "exists", self.settings.root)
        return time.monotonic() - started

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        if kwargs.get("deploy"):
            return []
        return [problem.error(self.alias) for problem in self.settings.problems]

    def close(self) -> None:
        self.client.close()
