"""One acquisition of a ZooKeeper lock: kazoo's ``Lock`` recipe, step by step.

``attempt()`` creates this acquisition's ephemeral sequential node once (its name
starts with a GUID, so a create retried after a connection loss finds the node the
first one made) and lists the contenders: the lowest holds the lock (readers: all
those with no writer ahead). ``wait()`` watches the node it waits for, and the one that
node waits for (no herd: a release wakes the waiter it grants and the one after it, or
the readers right behind a writer). The parent
path is not re-checked before each create (kazoo's ``Lock`` does): a create that
finds it gone re-creates it, so an uncontended acquire+release is 3 round trips.

A waiter whose blocker is the only one ahead of it (the usual case: it is next) is
granted by the watch event of that node's deletion, without listing the contenders
again (kazoo's ``Lock`` lists them): a contender created later has a higher sequence
(the parent, holding our node, is not reaped), so nothing can have come ahead of us.

A waiter with more contenders ahead also watches the one its blocker waits for, and
lists again when that one goes, while its blocker holds (:mod:`.ahead`): it is then
next, and granted by its blocker's delete event. When the blocker goes first (it gave
up), the waiter lists again.

A grant without a listing rests on our own node existing, in the session we are
connected in, when the blocker's deletion was applied. With the blocker's watch a waiter
that is next sets one on its own node (sent together: no extra wait; a waiter with more
ahead sets none: its grant comes from a listing, which shows our node). ZooKeeper
delivers a session's watch events in the order of the changes, and kazoo runs them in
that order: our node's deletion, had it come first, is seen before the blocker's. Where
that order says nothing, the waiter reads its node once (one round trip) before it takes
the grant: when the blocker was a node of our own session (a closed session deletes all
its nodes in one change, in no stated order), when the blocker was gone before its watch
was set, or when the watch on our node is not in place (it fired, or the connection
dropped: kazoo then drops every watch). A waiter whose node is gone queues again, at the
back, with a new node (kazoo's ``Lock`` too).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from asgiref.sync import sync_to_async
from kazoo.client import KazooState
from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError
from kazoo.protocol.states import EventType

from ...backoff import remaining
from ...exceptions import BackendUnavailable
from ...values import short_owner
from ..base import Acquisition, ExcInfo, Grant, Miss
from .ahead import AheadWatches
from .client import delete_guid, on_done
from .errors import ERRORS, ZOOKEEPER_ERRORS
from .paths import MARKER, READ_MARKER, blocker, contenders, downgrade_marker, guid_of

if TYPE_CHECKING:
    from kazoo.interfaces import IAsyncResult

    from ...hold import Hold
    from .backend import ZooKeeperBackend

#: How often a create is tried (within CONNECT_TIMEOUT) before giving up.
CREATE_TRIES = 5


def holder_data(token: str, hold: Hold) -> bytes:
    """The holder identity stored in a contender node (listings show it)."""
    owner, pid = short_owner(token), hold.pid or ""
    return f"1 {hold.kind} {owner} {pid} {hold.host} {hold.holder_field}".encode()


class ThreadHops(Acquisition):
    """kazoo is thread-based: the async twins run the sync steps in a worker thread of
    their own (not the shared one: a blocking call must not hold up the other tasks')."""

    backend: ZooKeeperBackend

    async def aattempt(self) -> Grant | Miss:
        return await sync_to_async(self.attempt, thread_sensitive=False)()

    async def aclose(self) -> None:
        await sync_to_async(self.close, thread_sensitive=False)()

    async def arelease(self, exc_info: ExcInfo) -> bool:
        return await sync_to_async(self.release, thread_sensitive=False)(exc_info)

    async def aextend(self, ttl: float) -> Grant | None:
        return await sync_to_async(self.extend, thread_sensitive=False)(ttl)


async def wait_until(event: asyncio.Event, deadline: float | None) -> None:
    """Wait for ``event`` until ``deadline`` (a monotonic time; None: for ever)."""
    try:
        async with asyncio.timeout(remaining(deadline)):
            await event.wait()
    except TimeoutError:
        pass


class ZooKeeperAcquisition(AheadWatches, ThreadHops):
    """An exclusive lock's acquisition (kazoo's ``Lock``); the read and write sides of
    a read-write lock are the subclasses below, which differ in class attributes only
    (kazoo's ``_NODE_NAME`` and ``_EXCLUDE_NAMES`` way)."""

    backend: ZooKeeperBackend
    #: What our node's name says it takes (see :mod:`.paths`).
    node_marker: ClassVar[str] = MARKER
    #: A read lock's: it may take the read side of its own holder's write node.
    reader: ClassVar[bool] = False
    #: A write lock's: readers of its holder find it (``backend.writers``).
    writer: ClassVar[bool] = False

    def __init__(
        self,
        hold: Hold,
        token: str,
        blocking: bool,
        deadline: float | None,
    ) -> None:
        super().__init__(hold, token, blocking, deadline)
        self.backend.usable()  # settings the checks report: refused before any call
        self.client = self.backend.client
        self.parent = self.backend.parent_of(hold.key)
        #: Public in node names, so not the owner token.
        self.guid = uuid.uuid4().hex
        self.node: str | None = None  # our contender's name, once created
        self.fencing: int | None = None
        self.session = 0  # the id of the session that owns our node
        self.predecessor: str | None = None
        #: Whether nothing else is ahead of us once the predecessor is gone.
        self.next_in_line = False
        #: The contender the predecessor waits for, when we are not next: its deletion
        #: (the predecessor's grant, usually) has us list again while the predecessor holds,
        #: so that the predecessor's deletion grants us without a listing.
        self.second: str | None = None
        self._gone = False  # the predecessor's deletion was seen (its watch event)
        #: The predecessor and the second whose watches are set and have not fired.
        self._watching: str | None = None
        self._predecessor_session = 0  # the session that owns the predecessor's node
        #: A watch is set on our own node and has not fired (see the module docstring).
        self._own_watch = False
        self._own_gone = False  # our node was found gone while waiting
        #: What the node's name says it takes (see :mod:`.paths`).
        self.marker = self.node_marker
        #: A reader's own held write node, when it takes the read side of it (a downgrade).
        self.downgrading: str | None = None
        self.granted = False
        self._abandoned = False
        self._uncertain = False  # a create may have happened that we did not see

    # -- the steps ----------------------------------------------------------------

    def attempt(self) -> Grant | Miss:
        self.client.watchers.add(self)
        listing, self._listing = self._listing, None
        for _ in range(CREATE_TRIES):
            if self.node is None:
                self._create_contender()
            sent = listing[1] if listing is not None and listing[0] == self.node else None
            listing = None
            order = contenders(self._children(sent))
            if self.node in order and self._session_id() is None:
                # Cut off since the listing came back (a follower that lost its leader
                # drops its clients): no session id is not another session. Requeueing
                # would leave our node, alive, ahead of the new one. List again.
                self.client.await_connected(time.monotonic() + self.client.settings.connect_timeout)
                continue
            if self.node not in order or not self._same_session():
                # Our node is gone (deleted, or its session ended while we queued), or it
                # is a node of an ended session still listed (CURATOR-604): queue again.
                self._requeue()
                continue
            ahead = blocker(order, self.node)
            if ahead is None or ahead == self.downgrading:
                return self._grant()
            self.predecessor = ahead
            order.remove(ahead)
            self.second = blocker(order, self.node)
            self.next_in_line = self.second is None
            return Miss(None)
        raise BackendUnavailable(
            f"ZooKeeper kept dropping the contender node of {self.hold.name!r} (session "
            "ending while queued)."
        )

    def _requeue(self) -> None:
        """Forget our node (it is gone, or goes with its session): the next create makes
        a new one, at the back of the queue."""
        self.node, self._own_watch, self._own_gone = None, False, False

    def _grant(self) -> Grant:
        self.granted = True
        self.hold.unsure = False
        if self.writer:
            self.backend.writers[self.parent] = self
        return Grant(self.fencing, datetime.now(UTC), None)

    def _create_contender(self) -> None:
        """Create our node; a reader whose holder holds the write side takes its read side
        at once (a downgrade: Curator's and kazoo's rule for the write holder's thread)."""
        writer = self.backend.writers.get(self.parent) if self.reader else None
        if (
            writer is None or not writer.granted or writer.node is None or not writer.hold.held
            or writer.hold.holder != self.hold.holder or not writer._same_session()
        ):
            self._create()
            return
        self.downgrading, self.marker = writer.node, downgrade_marker(writer.node)
        self._create()
        # Sorting right after the write node, ours jumps the writers queued behind it.
        # Touching the write node after ours exists fires their watches (and stops their
        # grant without a listing, see _watch), so each lists again and finds ours ahead.
        # A write node gone already (force release, session end) may have a successor
        # holding: ours then queues as a plain reader.
        try:
            self.client.call(
                "marking the downgrade", "set", f"{self.parent}/{writer.node}",
                holder_data(writer.token, writer.hold),
            )
        except NoNodeError:
            self._delete()
            self.client.unclaim(self)
            self.downgrading, self.marker, self.node = None, READ_MARKER, None
            self._create()

    def _create(self) -> None:
        """Create our contender node; after a connection loss, look for it by GUID first."""
        path = f"{self.parent}/{self.guid}{self.marker}"
        self.client.claim(self, path)
        data = holder_data(self.token, self.hold)
        until = time.monotonic() + self.client.settings.connect_timeout
        for _ in range(CREATE_TRIES):
            if self._uncertain and self._adopt(until):
                return
            try:
                result = self.client.get().create_async(
                    path, data, acl=self.client.acl, ephemeral=True, sequence=True,
                    include_data=True,
                )
            except ERRORS as exc:
                raise ZOOKEEPER_ERRORS.translate(exc, "creating a contender node") from exc
            self._uncertain = True  # until its answer is known
            on_done(result, self._late_create)
            try:
                created, stat = self.client.wait(result, "creating a contender node", until)
            except NoNodeError:  # the parent is gone (a reaped container): make it again
                self._uncertain = False
                self.client.create_parent(self.parent)
                continue
            except BackendUnavailable as exc:
                # A lost connection: kazoo reconnects to another server, and the create is
                # retried (finding its node by GUID). An unanswered call: no quorum is
                # reachable within CONNECT_TIMEOUT: the error is the answer.
                if not isinstance(exc.__cause__, ConnectionLoss | SessionExpiredError):
                    raise
                if isinstance(exc.__cause__, SessionExpiredError):
                    self._uncertain = False  # an ephemeral node of an ended session is gone
                if time.monotonic() > until:
                    raise
                self.client.await_connected(until)  # kazoo reconnects (a new session)
                continue
            # The node first, then "certain": close() in a cancelled task's thread must
            # never see neither (it would leave the node to nobody for the session).
            self.node, self.fencing = created.rsplit("/", 1)[1], stat.czxid
            self.session = stat.ephemeralOwner
            self._uncertain = False
            return
        raise BackendUnavailable(
            f"Could not create the contender node of {self.hold.name!r} in ZooKeeper."
        )

    def _adopt(self, until: float) -> bool:
        """Find the node an earlier create of ours made (the answer was lost)."""
        try:
            children = self.client.call(
                f"listing {self.parent}", "get_children", self.parent, until=until
            )
        except NoNodeError:
            children = []
        for child in children:
            if guid_of(child) == self.guid:
                stat = self.client.call(
                    "reading our node", "exists", f"{self.parent}/{child}", until=until
                )
                # Ours only if made by the session we are in: a node of an ended session
                # can still be listed for a moment (CURATOR-604), and goes.
                if stat is not None and stat.ephemeralOwner == self._session_id():
                    self.node, self.fencing = child, stat.czxid
                    self.session = stat.ephemeralOwner
                    self._uncertain = False
                    return True
        return False

    def _late_create(self, result: IAsyncResult) -> None:
        """A create answered after we gave up: delete what it made (kazoo's thread)."""
        if self._abandoned and result.successful():
            path = result.get()[0]
            self.client.get().delete_async(path)

    def wait(self, miss: Miss) -> Grant | None:
        """Watch the node just ahead; return when it goes, the session changes, or at
        the deadline (the handle then attempts again)."""
        self._wake.clear()
        self._listing = None
        if not self._watch():
            return self._after_predecessor(evented=False)
        if not self._own_gone:
            self._wake.wait(remaining(self.deadline))
        return self._after_predecessor(evented=True) if self._gone else None

    def _watch(self) -> bool:
        """Set a watch on the predecessor (and on our node when we are next, else on the
        second), unless set already; False if the predecessor is already gone."""
        path = f"{self.parent}/{self.predecessor}"
        # Only a waiter that is next is granted without a listing: only it needs to know
        # that its node outlived the predecessor.
        own = self._watch_own() if self.next_in_line else None
        second = self._watch_second() if self.second is not None else None
        try:
            if self._watching == self.predecessor:
                return True  # set by an earlier wait, and not fired
            self._gone = False
            self._watching = self.predecessor
            stat = self.client.call(f"watching {path}", "exists", path, watch=self._fired)
        finally:
            if own is not None:
                self._own_watched(own)
            if second is not None:
                self._second_watched(second)
        if stat is None:
            self._watching = None
            return False
        if stat.version:  # a write node its holder downgraded: a read node may be after it
            self.next_in_line = False
        self._predecessor_session = stat.ephemeralOwner
        return True

    def _fired(self, event: Any) -> None:
        """The predecessor's watch (kazoo's callback thread)."""
        if event.path is not None and event.path != f"{self.parent}/{self.predecessor}":
            return  # the watch of a node we waited for before (we queued again since)
        self._watching = None
        self.client.watch_events += 1
        # Only a deletion: a session's end resets watches with EventType.NONE.
        self._gone = event.type == EventType.DELETED
        if self._gone and not self.next_in_line:
            self._list_ahead()
        self._wake_up()

    def _watch_own(self) -> IAsyncResult | None:
        """Send the watch on our own node (answered with the predecessor's)."""
        if self._own_watch:
            return None
        # Set before sending: an event may come (and clear it) as soon as it is answered.
        self._own_watch = True
        try:
            return self.client.get().exists_async(
                f"{self.parent}/{self.node}", watch=self._own_node_changed
            )
        except ERRORS:
            self._own_watch = False
            return None

    def _own_watched(self, result: IAsyncResult) -> None:
        """The answer to the watch on our node: gone (we queue again) or not ours."""
        try:
            stat = self.client.wait(result, "watching our node")
        except BackendUnavailable:
            self._own_watch = False  # no order is known: the grant reads our node
            return
        if stat is None or stat.ephemeralOwner != self.session:
            self._own_watch = False  # the grant, if any, reads our node
            self._own_gone = stat is None  # no node comes back under its name

    def _own_node_changed(self, event: Any) -> None:
        """Any event on our node ends what its watch proves (kazoo's thread); a deletion
        wakes the waiter, which queues again."""
        if event.path is not None and event.path != f"{self.parent}/{self.node}":
            return  # the watch of a node we queued with before (we queued again since)
        self._own_watch = False
        if event.type == EventType.DELETED and not self.granted:
            self._own_gone = True
            self._wake_up()

    def _after_predecessor(self, evented: bool) -> Grant | None:
        """The predecessor is gone: the grant if nothing else is ahead of us and our node
        still exists in the connected session, else None (the handle attempts again)."""
        if not (self.next_in_line and self.client.connected() and self._same_session()):
            return None
        if self._own_gone:
            return None
        # No round trip when the events' order proves our node outlived the predecessor.
        if evented and self._own_watch and self._predecessor_session != self.session:
            return self._grant()
        return self._grant() if self._own_node_lives() else None

    def _own_node_lives(self) -> bool:
        """Read our node (one round trip): whether it exists in the session we are in."""
        stat = self.client.call("reading our node", "exists", f"{self.parent}/{self.node}")
        return stat is not None and stat.ephemeralOwner == self.session and self._same_session()

    def close(self) -> None:
        """No grant: delete our node, or, when that fails, have it deleted on reconnection
        (it would block the lock for as long as our session lives: kazoo issue 732)."""
        self._abandoned = True
        self.client.watchers.discard(self)
        self.client.unclaim(self)
        if self.node is None and not self._uncertain:
            return
        if not self.client.connected():
            # No answer would come before the session is back: the node (if any) is
            # deleted then (or goes with the session), without holding up the caller.
            self.client.orphans.add((self.parent, self.guid))
            return
        try:
            if self.node is not None:
                self._delete()
            else:
                delete_guid(self.client, self.parent, self.guid)
        except BackendUnavailable:
            self.client.orphans.add((self.parent, self.guid))
            raise

    def _delete(self) -> bool:
        """Delete our node; whether it was still there (ours to delete)."""
        path = f"{self.parent}/{self.node}"
        for retry in range(CREATE_TRIES):
            try:
                self.client.call("deleting our node", "delete", path)
            except NoNodeError:
                # Gone. After a delete whose answer was lost, in the session that made
                # the node: that delete did it. Else the session ended (or a force release).
                return retry > 0 and self._same_session()
            except BackendUnavailable as exc:
                if isinstance(exc.__cause__, SessionExpiredError):
                    return False  # an ephemeral node of an ended session is gone
                if isinstance(exc.__cause__, ConnectionLoss) and retry < CREATE_TRIES - 1:
                    continue  # sent again once kazoo has reconnected
                raise
            return True
        return False  # pragma: no cover (the loop returns or raises)

    def _same_session(self) -> bool:
        return self._session_id() == self.session

    def _session_id(self) -> int | None:
        """The id of the session this process' client is in now (None: none yet)."""
        try:
            return int(self.client.get().client_id[0])
        except (BackendUnavailable, TypeError):
            return None

    def release(self, exc_info: ExcInfo) -> bool:
        if self.backend.writers.get(self.parent) is self:
            del self.backend.writers[self.parent]
        released = self._delete()
        self.client.watchers.discard(self)
        self.client.unclaim(self)
        return released

    def extend(self, ttl: float) -> Grant | None:
        """The lock does not expire: check that our node still exists (one round trip)."""
        stat = self.client.call("reading our node", "exists", f"{self.parent}/{self.node}")
        if stat is None:
            return None
        return Grant(self.fencing, self.hold.acquired_at, None)

    # -- the session ----------------------------------------------------------------

    def session_changed(self, state: str) -> None:
        """SUSPENDED: the holder cannot tell whether it still holds (``lock.unsure``);
        CONNECTED: it does; LOST: it does not (``mark_lost``). Waiters wake up."""
        if self.granted:
            if state == KazooState.SUSPENDED:
                self.hold.set_unsure(True)
            elif state == KazooState.CONNECTED:
                self.hold.set_unsure(False)
            else:
                self.hold.set_unsure(False)
                self.client.watchers.discard(self)
                if self.backend.writers.get(self.parent) is self:
                    del self.backend.writers[self.parent]
                self.hold.mark_lost()
            return
        if state == KazooState.LOST:
            self._wake_up()

    # -- async: kazoo is thread-based; calls hop to a worker thread (not the shared one:
    # a blocking call must not hold up the other tasks' calls), the wait is a watch that
    # sets an asyncio.Event ----------------------------------------------------------------

    async def async_wait(self, miss: Miss) -> Grant | None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        self._async_wake = (loop, event)
        if not await sync_to_async(self._watch, thread_sensitive=False)():
            return await sync_to_async(self._after_predecessor, thread_sensitive=False)(False)
        if not self._own_gone:
            await wait_until(event, self.deadline)
        if not self._gone:
            return None
        return await sync_to_async(self._after_predecessor, thread_sensitive=False)(True)


class ZooKeeperReadAcquisition(ZooKeeperAcquisition):
    """The read side of a read-write lock: waits only for the write nodes ahead."""

    node_marker = READ_MARKER
    reader = True


class ZooKeeperWriteAcquisition(ZooKeeperAcquisition):
    """The write side of a read-write lock: waits for every node ahead."""

    writer = True
