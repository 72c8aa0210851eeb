"""How asyncio waiters hear a release: one pub/sub connection per event loop.

A waiting thread blocks in ``BLPOP`` on a list of its own (one connection
per waiting thread, like python-redis-lock). A thousand waiting tasks must
not hold a thousand connections, so the tasks of one event loop share a
:class:`Hub`: a channel of their own, subscribed on one connection. A
release ``PUBLISH``es the woken waiter's token on the channel its queue entry
names; the hub sets that waiter's event. A message lost while the hub
reconnects costs latency only: every waiter polls again within
:data:`~.acquisition.HEARTBEAT`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from typing import Any

from .errors import CLIENT_ERRORS, REDIS_ERRORS

logger = logging.getLogger("django_distlock")

#: Pause before the hub subscribes again after its connection failed.
RECONNECT_DELAY = 0.2
#: How long one read of the channel waits (no traffic: a wait on the socket) before the
#: hub looks whether it was cancelled.
LISTEN_SLICE = 1.0


class Hub:
    """The wake-ups of one event loop's waiters on one Redis alias."""

    def __init__(self, clients: list[Any], prefix: str) -> None:
        #: Tried in turn: the next one when subscribing (or a subscription) fails.
        self.clients = clients
        self.channel = f"{prefix}distlock:wake:{secrets.token_hex(8)}"
        self.events: dict[bytes, asyncio.Event] = {}
        self._ready: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def ready(self) -> None:
        """Return once the channel is subscribed (the first call starts the hub).

        :raises BackendUnavailable: when the first subscription fails (chained to the
            client's error).
        """
        if self._ready is None:
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            self._task = loop.create_task(self._run(), name=f"distlock-hub {self.channel}")
        await asyncio.shield(self._ready)

    def register(self, token: str) -> asyncio.Event:
        """The event set when ``token`` is woken; call before its first attempt."""
        event = self.events[token.encode()] = asyncio.Event()
        return event

    def unregister(self, token: str) -> None:
        self.events.pop(token.encode(), None)

    async def _run(self) -> None:
        assert self._ready is not None
        task = asyncio.current_task()
        assert task is not None
        turn = 0
        while True:
            pubsub = self.clients[turn % len(self.clients)].pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                if not self._ready.done():
                    self._ready.set_result(None)
                while True:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=LISTEN_SLICE
                    )
                    # A cancellation that meets redis-py's read timeout can be turned into
                    # that timeout and swallowed (Python 3.11's asyncio.timeout): look for
                    # it, or the loop's shutdown (asyncio.run) would wait on us forever.
                    if task.cancelling():
                        raise asyncio.CancelledError
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        if isinstance(data, str):  # a client with decode_responses=True
                            data = data.encode()
                        event = self.events.get(data)
                        if event is not None:
                            event.set()
            except (*CLIENT_ERRORS, OSError) as exc:
                turn += 1
                if not self._ready.done() and turn < len(self.clients):
                    continue  # the first subscription: the next node at once
                if not self._ready.done():
                    error = REDIS_ERRORS.translate(exc, "subscribing to the wake-up channel")
                    error.__cause__ = exc
                    self._ready.set_exception(error)
                    self._ready = None  # the next waiter tries again
                    return
                logger.warning("Redis lock wake-up channel lost; resubscribing", exc_info=True)
                await asyncio.sleep(RECONNECT_DELAY)
            finally:
                await asyncio.shield(_close(pubsub))


async def _close(pubsub: Any) -> None:
    with contextlib.suppress(*CLIENT_ERRORS, OSError):
        await pubsub.aclose()


class Hubs:
    """One :class:`Hub` per running event loop."""

    def __init__(self) -> None:
        self._hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, clients: list[Any], prefix: str) -> Hub:
        loop = asyncio.get_running_loop()
        hub = self._hubs.get(loop)
        if hub is None or (hub._task is not None and hub._task.done()):
            hub = self._hubs[loop] = Hub(clients, prefix)
        return hub
