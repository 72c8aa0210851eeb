"""One lease of a ZooKeeper semaphore: kazoo's ``Semaphore`` recipe, step by step.

Waiters queue for a gate (an exclusive lock under the semaphore's node, so they
are served in arrival order and only one watches the leases: no herd). The gate's
holder counts the lease nodes; below the limit it creates its own lease (ephemeral
sequential, named by GUID like a lock's contender) and opens the gate; at the limit
it keeps the gate and watches the leases until one goes.

The limit is the data of the semaphore's node, stored by its first user (a
conditional write of the empty data: of clients storing at once one wins, the others
compare); a client whose limit differs is refused before it queues. The gate's holder
sees the node's mzxid in its listing: a node re-created meanwhile (a reaped container)
is checked again before a lease is taken.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, NoNodeError

from ...backoff import remaining
from ...exceptions import BackendUnavailable, SemaphoreLimitMismatch
from ..base import ExcInfo, Grant, Miss
from .acquisition import CREATE_TRIES, ThreadHops, ZooKeeperAcquisition, wait_until
from .paths import GATE, LEASE_MARKER

if TYPE_CHECKING:
    from ...hold import Hold
    from .backend import ZooKeeperBackend


class SemaphoreAcquisition(ThreadHops):
    backend: ZooKeeperBackend

    def __init__(
        self,
        hold: Hold,
        token: str,
        blocking: bool,
        deadline: float | None,
    ) -> None:
        super().__init__(hold, token, blocking, deadline)
        assert hold.limit is not None
        self.limit = hold.limit
        self.client = self.backend.client  # (its gate and lease check the settings)
        self.parent = self.backend.parent_of(hold.key)
        self.gate = ZooKeeperAcquisition(hold, token, blocking, deadline)
        self.gate.parent = f"{self.parent}/{GATE}"
        self.lease = ZooKeeperAcquisition(hold, token, blocking, deadline)
        self.lease.marker = LEASE_MARKER
        self._gate_held = False
        # The mzxid of the node whose limit matched ours (known from an earlier acquisition
        # of this process: no read then, the gate holder's listing still compares it).
        self._checked: int | None = self.backend.checked_limits.get((self.parent, self.limit))
        self._changed = threading.Event()
        self._async_changed: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def attempt(self) -> Grant | Miss:
        if self._checked is None:
            self._check_limit()
        if not self._gate_held:
            result = self.gate.attempt()
            if isinstance(result, Miss):
                return result
            self._through_gate(result)
        # Holding the gate: nobody else adds a lease meanwhile.
        self._changed.clear()
        watch = self._leases_changed if self.blocking else None
        children, stat = self.client.call(
            f"listing {self.parent}", "get_children", self.parent, watch=watch,
            include_data=True,
        )
        if stat.mzxid != self._checked:  # re-created (or written) since we read the limit
            self._check_limit()
        if sum(LEASE_MARKER in child for child in children) >= self.limit:
            return Miss(None)  # keep the gate: we are next when a lease goes
        self.lease._create()
        self.lease.granted = True
        self.client.watchers.add(self.lease)
        self._open_gate()
        return Grant(self.lease.fencing, datetime.now(UTC), None)

    def _check_limit(self) -> None:
        """Store our limit in the semaphore's node if it has none, else compare.

        :raises SemaphoreLimitMismatch: when the stored limit is another one.
        """
        given = str(self.limit).encode()
        for _ in range(CREATE_TRIES):
            try:
                stored, stat = self.client.call(
                    f"reading the limit of {self.parent}", "get", self.parent
                )
            except NoNodeError:
                self.client.create_parent(self.parent)
                continue
            if not stored:  # new (or made by a lock of that name): store ours, if first
                try:
                    stat = self.client.call(
                        f"storing the limit of {self.parent}", "set", self.parent, given,
                        version=stat.version,
                    )
                except (BadVersionError, NoNodeError):
                    continue  # another client stored its limit first: compare with it
                stored = given
            if stored != given:
                text = stored.decode(errors="replace")
                raise SemaphoreLimitMismatch(
                    f"The stored limit of the semaphore {self.hold.name!r} is {text}; this "
                    f"client gave {self.limit}: every client of a semaphore must use "
                    "the same limit (the stored one goes with the semaphore's node, once no "
                    "lease or waiter is left).",
                    stored=int(text) if text.isdigit() else None, given=self.limit,
                )
            self._checked = stat.mzxid
            self.backend.remember_limit(self.parent, self.limit, stat.mzxid)
            return
        raise BackendUnavailable(
            f"ZooKeeper kept removing the node of the semaphore {self.hold.name!r}."
        )

    def _open_gate(self) -> None:
        self._gate_held = False
        self.client.watchers.discard(self)
        self.gate.release((None, None, None))

    def _leases_changed(self, event: Any) -> None:
        self.client.watch_events += 1
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        if self._async_changed is not None:
            loop, event = self._async_changed
            loop.call_soon_threadsafe(event.set)

    def _through_gate(self, gate: Grant | None) -> None:
        """When the gate was granted (by an attempt or a wait), hold it: the next step
        counts the leases (a gate's grant is never the semaphore's)."""
        if gate is not None:
            self._gate_held = True
            self.client.watchers.add(self)

    def session_changed(self, state: str) -> None:
        if state == KazooState.LOST:
            self._wake()

    def wait(self, miss: Miss) -> Grant | None:
        if not self._gate_held:
            self._through_gate(self.gate.wait(miss))
            return None
        self._changed.wait(remaining(self.deadline))
        return None

    def close(self) -> None:
        self.client.watchers.discard(self)
        try:
            self.lease.close()  # a lease whose create's answer was lost, if any
        finally:
            if self._gate_held:
                self._open_gate()
            else:
                self.gate.close()

    def release(self, exc_info: ExcInfo) -> bool:
        return self.lease.release(exc_info)

    def extend(self, ttl: float) -> Grant | None:
        return self.lease.extend(ttl)

    # -- async: as for locks (see .acquisition) ---------------------------------------

    async def async_wait(self, miss: Miss) -> Grant | None:
        if not self._gate_held:
            self._through_gate(await self.gate.async_wait(miss))
            return None
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        self._async_changed = (loop, event)
        if self._changed.is_set():
            return None
        await wait_until(event, self.deadline)
        return None
