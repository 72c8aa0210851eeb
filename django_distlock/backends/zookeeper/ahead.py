"""How a ZooKeeper waiter hears that the contenders ahead changed, and the listing it
sends at once when they did (see :mod:`.acquisition`).

A waiter that is not next watches, with the node just ahead of it (the predecessor),
the node the predecessor waits for (the second). The second's deletion is usually the
predecessor's grant: the waiter lists the contenders again while the predecessor holds,
finds that it is next, and is then granted by the predecessor's delete event without a
listing between that event and the grant. A release wakes two waiters, whatever the
queue's length: the one it grants and the one after it. The listings a watch event
calls for are sent by kazoo's callback thread as the event arrives, not by the waiting
thread once it has woken up.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError

from ...exceptions import BackendUnavailable
from .errors import ERRORS

if TYPE_CHECKING:
    from kazoo.interfaces import IAsyncResult

    from .client import Client

_LIST_ERRORS: tuple[type[BaseException], ...] = (BackendUnavailable, *ERRORS)


class AheadWatches:
    """The second's watch, the listing sent ahead, and the waiter's wake-up."""

    client: Client
    parent: str
    node: str | None
    second: str | None
    next_in_line: bool

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)  # the acquisition's
        self._wake = threading.Event()
        self._async_wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        #: (our node, the listing kazoo's callback thread sent when a node ahead went):
        #: the next attempt's listing, when our node is still that node.
        self._listing: tuple[str | None, IAsyncResult] | None = None
        #: The second whose watch is set and has not fired.
        self._watching_second: str | None = None

    def _children(self, sent: IAsyncResult | None) -> list[str]:
        """The parent's children: the answer to the listing ``sent`` ahead (see
        :meth:`_list_ahead`), or to one sent now."""
        if sent is not None:
            try:
                return list(self.client.wait(sent, f"listing {self.parent}"))
            except NoNodeError:
                return []
            except BackendUnavailable as exc:  # a read cut by a connection loss: again
                if not isinstance(exc.__cause__, ConnectionLoss | SessionExpiredError):
                    raise
        try:
            return list(self.client.call(f"listing {self.parent}", "get_children", self.parent))
        except NoNodeError:
            return []

    def _watch_second(self) -> IAsyncResult | None:
        """Send the watch on the second (answered with the predecessor's)."""
        if self._watching_second == self.second:
            return None
        self._watching_second = self.second
        try:
            return self.client.get().exists_async(
                f"{self.parent}/{self.second}", watch=self._second_changed
            )
        except ERRORS:
            self._watching_second = None
            return None

    def _second_watched(self, result: IAsyncResult) -> None:
        """The answer to the watch on the second: gone already, we list again now."""
        try:
            stat = self.client.wait(result, "watching the contender ahead")
        except BackendUnavailable:
            self._watching_second = None  # the predecessor's deletion has us list again
            return
        if stat is None:
            self._watching_second = None
            self._list_ahead()
            self._wake_up()

    def _second_changed(self, event: Any) -> None:
        """Any event on the second (kazoo's callback thread): list again, at once."""
        if event.path is not None and event.path != f"{self.parent}/{self.second}":
            return  # a second of an earlier wait
        self._watching_second = None
        self.client.ahead_events += 1
        if not self.next_in_line:
            self._list_ahead()
        self._wake_up()

    def _list_ahead(self) -> None:
        """Send the next attempt's listing now (kazoo's callback thread: the node we
        waited for went, and others may still be ahead)."""
        try:
            self._listing = (self.node, self.client.get().get_children_async(self.parent))
        except _LIST_ERRORS:
            self._listing = None  # the attempt lists as usual

    def _wake_up(self) -> None:
        """Wake the waiter, sync or async (any thread)."""
        self._wake.set()
        if self._async_wake is not None:
            loop, event = self._async_wake
            loop.call_soon_threadsafe(event.set)

