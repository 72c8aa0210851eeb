"""Reentrant ZooKeeper locks: Curator's ``InterProcessMutex`` count, per process and owner.

A reentrant lock's node belongs to this process' session, so its count lives in this
process: the first acquisition of an owner creates the node (``acquisition.py``), and
while it holds, every other acquisition of that owner (the same handle acquiring
again, or another handle given the same ``owner``, in any thread) rides on it: one
read that the node still exists in our session (a force release or a lost session
must not be acquired again as if held), the count up, no second node. Each release
counts down; the last deletes the node. Another process with the same ``owner`` does
not share it (the node would go with the first process' session): it waits, as
Curator's other JVMs do.

An acquisition of the owner that queued before the first was granted (its node is
behind the holder's) is woken by that grant: it deletes its node and rides.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ...exceptions import LockLost
from ..base import ExcInfo, Grant, Miss
from .acquisition import ZooKeeperAcquisition

if TYPE_CHECKING:
    from .backend import ZooKeeperBackend


@dataclass
class Hold:
    """The node an owner holds a reentrant lock with, and how many acquisitions hold it."""

    node: str
    fencing: int | None
    session: int
    acquired_at: datetime
    creator: ZooKeeperAcquisition
    count: int = 1


class Holds:
    """This process' reentrant holds, by (lock parent path, owner token)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._holds: dict[tuple[str, str], Hold] = {}

    def get(self, key: tuple[str, str]) -> Hold | None:
        """The hold of ``key``, if any."""
        return self._holds.get(key)

    def join(self, key: tuple[str, str], hold: Hold) -> bool:
        """Count one more acquisition of ``hold``, unless it ended meanwhile."""
        with self._mutex:
            if self._holds.get(key) is not hold:
                return False
            hold.count += 1
            return True

    def start(self, key: tuple[str, str], hold: Hold) -> None:
        """Record the first acquisition of ``key`` (replacing a stale hold)."""
        with self._mutex:
            self._holds[key] = hold

    def leave(self, key: tuple[str, str], node: str | None) -> tuple[bool, Hold | None]:
        """Count one acquisition of ``key`` on ``node`` less: whether the caller deletes the
        node now (the hold's last, or a node no hold counts: one of an ended hold), and
        the hold that ended (None: none did)."""
        with self._mutex:
            hold = self._holds.get(key)
            if hold is None or hold.node != node:
                return node is not None, None
            hold.count -= 1
            if hold.count > 0:
                return False, None
            del self._holds[key]
            return True, hold

    def drop(self, key: tuple[str, str], hold: Hold) -> None:
        """Forget ``hold`` (found stale), unless another replaced it already."""
        with self._mutex:
            if self._holds.get(key) is hold:
                del self._holds[key]

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._holds


class ReentrantAcquisition(ZooKeeperAcquisition):
    """One acquisition of a reentrant exclusive lock (see the module docstring)."""

    backend: ZooKeeperBackend

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.hold_key = (self.parent, self.token)
        #: A hold of our owner started while we queued: attempt again, and ride on it.
        self._hold_ready = False
        self._hold: Hold | None = None

    def attempt(self) -> Grant | Miss:
        holds = self.backend.holds
        hold = holds.get(self.hold_key)
        if hold is not None:
            if not self._still_held(hold):
                holds.drop(self.hold_key, hold)  # its node is gone: the hold is over
                if self.hold.acquisition is not None:  # this handle held it: lost
                    self.hold.mark_lost()
                    raise LockLost(f"{self.hold!r} was lost before it was acquired again.")
            elif holds.join(self.hold_key, hold):  # (not released meanwhile)
                self._ride(hold)
                return Grant(hold.fencing, hold.acquired_at, None)
        self._hold_ready = False
        result = super().attempt()
        if isinstance(result, Grant):
            self._started()
        return result

    def _still_held(self, hold: Hold) -> bool:
        """Whether ``hold``'s node still exists in our session (one read); any node of our
        own queued meanwhile goes first."""
        if self.node is not None:
            super().release((None, None, None))
            self.node = None
        if self._session_id() != hold.session:  # ended, or a forked child's own session
            return False
        stat = self.client.call("reading the held node", "exists", f"{self.parent}/{hold.node}")
        return stat is not None and stat.ephemeralOwner == hold.session

    def _ride(self, hold: Hold) -> None:
        """Hold ``hold``'s node with it (counted already)."""
        self.node, self.fencing, self.session = hold.node, hold.fencing, hold.session
        self._hold = hold
        self.granted = True
        self.hold.unsure = False
        if self.hold.acquisition is None:  # another handle: it hears of the session too
            self.client.watchers.add(self)

    def _started(self) -> None:
        """Our node was granted: start the hold, and wake the owner's queued acquisitions."""
        assert self.node is not None
        self._hold = Hold(
            self.node, self.fencing, self.session, datetime.now(UTC), creator=self
        )
        self.backend.holds.start(self.hold_key, self._hold)
        for other in list(self.client.watchers):
            if (
                isinstance(other, ReentrantAcquisition) and other is not self
                and other.hold_key == self.hold_key and not other.granted
            ):
                other._hold_ready = True
                other._wake_up()

    def wait(self, miss: Miss) -> Grant | None:
        grant = super().wait(miss)
        if grant is not None:
            self._started()
        return grant

    async def async_wait(self, miss: Miss) -> Grant | None:
        grant = await super().async_wait(miss)
        if grant is not None:
            self._started()
        return grant

    def _watch(self) -> bool:
        watched = super()._watch()
        if self._hold_ready or self.hold_key in self.backend.holds:
            self._wake_up()  # after the wait's clear(): the wait ends, the attempt rides
        return watched

    def release(self, exc_info: ExcInfo) -> bool:
        last, ended = self.backend.holds.leave(self.hold_key, self.node)
        if self.hold.acquisition is None:  # this handle holds no more
            self.client.watchers.discard(self)
        if not last:
            return True  # another acquisition still holds the node
        if ended is not None and ended.creator is not self:
            self.client.unclaim(ended.creator)  # its node's size leaves the session
        return super().release(exc_info)
