"""One acquisition of a Redis lock: each step is one script (see :mod:`.scripts`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from ...backoff import remaining
from ...exceptions import BackendUnavailable
from ..base import Acquisition, ExcInfo, Grant, Miss
from .client import NoConnection
from .giveback import GIVE_BACKS
from .keys import Keys, Packed
from .scripts import SCRIPTS

if TYPE_CHECKING:
    from ...hold import Hold
    from .backend import RedisBackend

#: Longest a waiter blocks before it asks again (and so renews its place in the
#: queue): bounds how long a waiter that died keeps the next one waiting.
HEARTBEAT = 1.0
#: How long a queued waiter counts as alive after each attempt (HEARTBEAT + slack).
ALIVE_MS = 2500
#: Shortest block worth a round trip.
MIN_BLOCK = 0.001
#: How late Redis may end a ``BLPOP`` past its timeout: it checks blocked clients'
#: timeouts ``hz`` times a second (10 by default). A block that the deadline bounds
#: ends this much early; the rest of the wait polls every :data:`POLL`.
SERVER_TICK = 0.1
POLL = 0.01
#: How long past its own bound (the deadline, the block, the lease's end) a call waits
#: for a reply: a frozen server must not hold an acquire, wait, release or extend for
#: ever when the connection has no socket timeout (redis-py's default).
READ_GRACE = 1.0
#: The acquire script's reply (after a 0) to an attempt that ran after its ``not_after``.
REFUSED = -2



class Calls(NamedTuple):
    """The keys of one lock and its hot-path script calls, packed once per lock."""

    keys: Keys
    acquire: Packed
    release: Packed
    extend: Packed
    leave: Packed

    @classmethod
    def of(cls, keys: Keys, listing: bool = True) -> Calls:
        """The calls of the lock of ``keys``; without ``listing`` (an alias that keeps
        no listing index) the release leaves the index alone (an empty member)."""
        k = keys
        return cls(
            keys,
            Packed(
                SCRIPTS["acquire"],
                (k.lock, k.queue, k.waiters, k.seq, k.listing),
                (k.member, ALIVE_MS),
            ),
            Packed(
                SCRIPTS["release"],
                (k.lock, k.queue, k.waiters, k.listing),
                (k.member if listing else "",),
            ),
            Packed(SCRIPTS["extend"], (k.lock,), ()),
            Packed(SCRIPTS["leave"], (k.lock, k.queue, k.waiters), ()),
        )


def _when(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


class RedisAcquisition(Acquisition):
    backend: RedisBackend

    def __init__(
        self,
        hold: Hold,
        token: str,
        blocking: bool,
        deadline: float | None,
    ) -> None:
        super().__init__(hold, token, blocking, deadline)
        self.calls = self.backend.calls_for(hold.key)
        self.keys = self.calls.keys
        self._ttl_ms = max(int(hold.ttl * 1000), 1)
        self._queued = False
        self._event: asyncio.Event | None = None
        self._hub: Any = None
        #: An attempt was sent and its reply not read (yet): it may hold the lock.
        self._pending = False
        #: The server failed or did not answer that attempt: no cleanup call now.
        self._failed = False
        #: The token is this acquisition's own (not a held lock's acquired again, nor an
        #: explicit owner's): a lock held under it can only be what an attempt got.
        self._fresh = hold.fresh_token
        redis = self.backend.redis
        #: How the acquire script is sent: the client's own calls, bound here so that the
        #: hot path has no extra layer (:mod:`.replication` puts ``WAIT`` behind them).
        self._call: Callable[..., Any] = redis.call
        self._block_then_call: Callable[..., Any] = redis.block_then_call
        self._acall: Callable[..., Any] = redis.acall

    # -- the scripts' arguments and replies ----------------------------------

    def _acquire_args(self, signal: str, not_after: int) -> tuple[str | int, ...]:
        hold = self.hold
        flags = self.backend.flags
        if hold.shares_owner:  # handles given one owner: the server counts them
            flags += "r"
        if self.blocking:
            flags += "j"
        if self._queued:
            flags += "q"
        holder = f"{hold.host} {hold.pid} {hold.holder_field}"
        return (self.token, self._ttl_ms, holder, flags, signal, not_after)

    def _not_after(self, sent: float, read_timeout: float) -> int:
        """The server time (ms) after which an attempt sent at ``sent`` and awaited
        ``read_timeout`` seconds refuses itself: half of :data:`READ_GRACE` before this
        process stops waiting for its reply, the other half left for the reply to come."""
        return self.backend.redis.server_time(sent + read_timeout - READ_GRACE / 2)

    def _result(self, reply: Any, granted_after: float = 0.0) -> Grant | Miss:
        if reply[0] == 1:
            _, fencing, acquired, now, _count = reply
            self.backend.redis.observe(now)
            return Grant(fencing, _when(acquired), _when(now + self._ttl_ms), granted_after)
        left = reply[1]  # ms until the holder's lease (or the queue head's turn) ends
        if left == REFUSED:  # it ran too late for this offset: measure it again
            self.backend.redis.offset = None
            return Miss(0.0)
        self._queued = self.blocking
        return Miss(left / 1000 if left >= 0 else None)

    def _bound(self, miss: Miss) -> float:
        """How long to block: until the holder's lease ends, the deadline, or the heartbeat."""
        bound = HEARTBEAT
        if miss.retry_after is not None:
            bound = min(bound, miss.retry_after + 0.001)
        left = remaining(self.deadline)
        if left is not None:
            bound = min(bound, left)
        return bound

    def _until_deadline(self) -> float:
        """How long an attempt waits for its reply: until the deadline (or, without
        one, the lease it asks for), plus :data:`READ_GRACE`."""
        left = remaining(self.deadline)
        return max(self.hold.ttl if left is None else left, 0.0) + READ_GRACE

    def _until_lease_end(self) -> float:
        """How long a release or extend waits for its reply: until the lease ends on
        this process' clock, plus :data:`READ_GRACE` (after that it is gone anyway)."""
        until = self.hold.valid_until
        left = self.hold.ttl if until is None else until - time.monotonic()
        return max(left, 0.0) + READ_GRACE

    def _released(self, reply: Any) -> bool:
        return bool(reply)

    def _extended(self, reply: Any, ttl: float) -> Grant | None:
        if not reply:
            return None
        fencing, acquired, now = reply
        return Grant(fencing, _when(acquired), _when(now + int(ttl * 1000)))

    # -- sync -----------------------------------------------------------------

    def attempt(self) -> Grant | Miss:
        if not self.backend.server_checked:  # once per process and alias
            self.backend.ensure_checked(self._until_deadline())
        redis = self.backend.redis
        signal = "L " + self.keys.signal + self.token
        for _ in range(2):  # once more after a refusal, with the offset measured again
            if redis.offset is None:  # once per process and alias
                redis.measure(self._until_deadline())
            timeout = self._until_deadline()
            args = self._acquire_args(signal, self._not_after(time.monotonic(), timeout))
            self._pending = True
            reply = self._call(self.calls.acquire, args, timeout)
            self._pending = False
            if reply[0] == 1 or reply[1] != REFUSED:
                break
            redis.offset = None
        return self._result(reply)

    def wait(self, miss: Miss) -> Grant | None:
        """Block on this waiter's signal list until a release wakes it, the holder's
        lease ends, the deadline, or the heartbeat, with the next attempt written
        behind the block: Redis runs it as soon as the block ends. Repeat until a
        grant, or return None near the deadline."""
        redis, signal = self.backend.redis, self.keys.signal + self.token
        entered = time.monotonic()
        while True:
            bound = self._bound(miss)
            capped = bound > self.backend.max_block
            if capped:
                bound = self.backend.max_block
            left = remaining(self.deadline)
            if left is not None and bound > left - SERVER_TICK:
                bound = left - SERVER_TICK
                if bound < MIN_BLOCK:  # too close to the deadline for Redis' timer
                    time.sleep(max(min(left, POLL), 0.0))
                    return None
            if bound < MIN_BLOCK:
                if capped:  # a socket timeout too short to block in Redis: poll
                    time.sleep(POLL if left is None else max(min(left, POLL), 0.0))
                return None
            if redis.offset is None:  # after a refusal
                redis.measure(self._until_deadline())
            sent = time.monotonic()
            read_timeout = bound + SERVER_TICK + READ_GRACE
            self._pending = True
            replies = self._block_then_call(
                signal,
                bound,
                self.calls.acquire,
                self._acquire_args("L " + signal, self._not_after(sent, read_timeout)),
                read_timeout,
            )
            self._pending = False
            if replies is None:  # a cluster (it only blocked), or a miss after NOSCRIPT
                return None
            before, reply = replies
            # A grant came when the block ended: ``sent`` plus the block's length on the
            # server's clock (less 1 ms of rounding) after the handle called wait().
            blocked = max(reply[3] - before - 1, 0) / 1000 if reply[0] == 1 else 0.0
            result = self._result(reply, sent - entered + blocked)
            if isinstance(result, Grant):
                return result
            miss = result

    def close(self) -> None:
        if self._pending:  # failed or interrupted: the server may not answer now
            self._give_back_later()
        elif self._queued:
            self.backend.redis.call(self.calls.leave, (self.token,), READ_GRACE)

    def _give_back_later(self) -> None:
        """Hand an abandoned attempt's give-back to the process' give-back thread, to
        be tried until the lease that attempt could have got has ended."""
        until = time.monotonic() + self.hold.ttl + READ_GRACE
        GIVE_BACKS.add(self.backend.redis, self.calls, self.token, self._fresh, until)

    def release(self, exc_info: ExcInfo) -> bool:
        reply = self.backend.redis.call(
            self.calls.release, (self.token,), self._until_lease_end(), spare=True
        )
        return self._released(reply)

    def extend(self, ttl: float) -> Grant | None:
        reply = self.backend.redis.call(
            self.calls.extend, (self.token, max(int(ttl * 1000), 1)), self._until_lease_end(),
            spare=True,
        )
        return self._extended(reply, ttl)

    # -- async: redis.asyncio, and the loop's hub for wake-ups ----------------------

    async def aattempt(self) -> Grant | Miss:
        if not self.backend.server_checked:  # once per process and alias
            await self.backend.aensure_checked(self._until_deadline())
        redis = self.backend.redis
        if self.blocking:
            if self._hub is None:
                hub = self.backend.hubs.get(redis.aio_pubsub(), self.backend.key_prefix)
                bound = self._until_deadline()
                try:
                    async with asyncio.timeout(bound):
                        await hub.ready()
                except TimeoutError as exc:
                    raise BackendUnavailable(
                        f"Redis did not confirm the wake-up subscription within {bound:.3g} s"
                    ) from exc
                self._hub = hub
                self._event = self._hub.register(self.token)
            assert self._event is not None
            self._event.clear()  # a wake-up from now on is for this attempt's miss
            signal = "P " + self._hub.channel
        else:
            signal = ""
        try:
            for _ in range(2):  # once more after a refusal, with the offset measured again
                if redis.offset is None:  # once per process and alias
                    await redis.ameasure(self.deadline, self._until_deadline())
                timeout = self._until_deadline()
                args = self._acquire_args(signal, self._not_after(time.monotonic(), timeout))
                self._pending = True
                reply = await self._acall(self.calls.acquire, args, self.deadline, timeout)
                self._pending = False
                if reply[0] == 1 or reply[1] != REFUSED:
                    break
                redis.offset = None
        except NoConnection:  # the deadline passed while the loop's connections were busy
            self._pending = False  # nothing was sent
            return Miss(None)
        except BackendUnavailable:
            self._failed = True
            raise
        result = self._result(reply)
        if isinstance(result, Grant) and self._hub is not None:
            self._hub.unregister(self.token)
        return result

    async def async_wait(self, miss: Miss) -> Grant | None:
        bound = self._bound(miss)
        if bound < MIN_BLOCK or self._event is None:
            return None
        try:
            async with asyncio.timeout(bound):
                await self._event.wait()
        except TimeoutError:
            pass
        return None

    async def aclose(self) -> None:
        if self._hub is not None:
            self._hub.unregister(self.token)
        if self._pending:
            # Cancelled (wait_for, a client gone) with its attempt maybe granted: give it
            # back now (the handle shields this), within READ_GRACE; a server that fails
            # or does not answer gets it from the give-back thread.
            if not self._failed:
                try:
                    await self._agive_back(time.monotonic() + READ_GRACE)
                    return
                except (BackendUnavailable, NoConnection):
                    pass
            self._give_back_later()
        elif self._queued:
            await self.backend.redis.acall(self.calls.leave, (self.token,), None, READ_GRACE)

    async def _agive_back(self, until: float) -> None:
        """Async :func:`.giveback.give_back`, every call ending by ``until``."""
        redis = self.backend.redis
        if self._fresh:
            await redis.acall(
                self.calls.release, (self.token,), until, max(until - time.monotonic(), 0.0)
            )
        await redis.acall(
            self.calls.leave, (self.token,), until, max(until - time.monotonic(), 0.0)
        )

    async def arelease(self, exc_info: ExcInfo) -> bool:
        reply = await self.backend.redis.acall(
            self.calls.release, (self.token,), None, self._until_lease_end()
        )
        return self._released(reply)

    async def aextend(self, ttl: float) -> Grant | None:
        reply = await self.backend.redis.acall(
            self.calls.extend, (self.token, max(int(ttl * 1000), 1)), None, self._until_lease_end()
        )
        return self._extended(reply, ttl)
