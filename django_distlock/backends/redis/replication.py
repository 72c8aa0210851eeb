"""Grants that survive a failover: ``OPTIONS["WAIT_REPLICAS"] = N`` makes every grant
and extension wait (Redis ``WAIT N ms``) until N replicas acknowledged it.

Redis replicates asynchronously: a master that fails right after a grant may be
replaced (by Sentinel) with a replica that never saw it, and the next client is
granted the same lock. ``WAIT`` is written in the same send as the acquire script,
on the same connection (it waits for that connection's last write): a grant costs
no extra round trip, only the replicas' acknowledgement. A grant that is not
acknowledged in time is undone (the release script, with the owner token) and the
acquire raises :class:`~django_distlock.exceptions.NotReplicated`; an extension
that is not acknowledged raises it too and leaves the lease at its previous end (the
replicated one). A release does not wait: a release lost in a failover leaves the
lock held until its lease ends (a delay, never a second holder).

The scripts go as ``EVAL`` (not ``EVALSHA``): a replica promoted by a failover has
no script loaded, and a ``NOSCRIPT`` in the middle of a pipelined send would leave
the ``WAIT`` reply unread.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ...backoff import remaining
from ...exceptions import BackendUnavailable, InvalidBackendOptions, NotReplicated
from ..base import Grant
from .acquisition import READ_GRACE, Calls, RedisAcquisition
from .client import NoConnection
from .errors import CLIENT_ERRORS, REDIS_ERRORS, did_not_answer
from .keys import TIME_COMMAND, Packed, bulk

if TYPE_CHECKING:
    from ...hold import Hold
    from .backend import RedisBackend

#: Most replicas ``WAIT_REPLICAS`` may name.
MAX_REPLICAS = 64
#: ``WAIT_TIMEOUT``'s default and bounds (seconds).
DEFAULT_WAIT = 1.0
MAX_WAIT = 60.0
#: Shortest ``WAIT`` sent: ``WAIT n 0`` would block for ever.
MIN_WAIT_MS = 1
_MEMO = 4096


class InvalidReplicationOptions(InvalidBackendOptions):
    """``WAIT_REPLICAS`` or ``WAIT_TIMEOUT`` is unusable (system check ``distlock.E012``)."""

    check_id = "distlock.E012"


class Replication(NamedTuple):
    """How many replicas must acknowledge a grant, and for at most how long."""

    replicas: int
    timeout: float

    def wait_ms(self, deadline: float | None, ttl: float, cap: float) -> int:
        """The ``WAIT`` timeout: :attr:`timeout`, cut to the acquire's deadline, to the
        lease (waiting longer than the lease is pointless) and to ``cap``.

        :param deadline: the acquire's deadline (``time.monotonic()``), or None.
        :param ttl: the lease asked for, seconds.
        :param cap: the longest reply the socket timeout lets a read wait for, seconds.
        :returns: milliseconds, at least :data:`MIN_WAIT_MS` (``WAIT n 0`` never ends).
        """
        bound = min(self.timeout, ttl, cap)
        left = remaining(deadline)
        if left is not None:
            bound = min(bound, left)
        return max(int(bound * 1000), MIN_WAIT_MS)

    def command(self, ms: int) -> bytes:
        """``WAIT`` for :attr:`replicas`, packed.

        :param ms: the ``WAIT`` timeout, milliseconds (> 0).
        :returns: the RESP command.
        """
        return b"*3\r\n$4\r\nWAIT\r\n%s%s" % (bulk(self.replicas), bulk(ms))


def replication_options(
    alias: str, options: Mapping[str, Any], cluster: bool
) -> Replication | None:
    """Read ``WAIT_REPLICAS`` and ``WAIT_TIMEOUT`` (no I/O).

    :param alias: the lock alias, for the messages.
    :param options: the alias' ``OPTIONS``.
    :param cluster: whether the alias is a Redis Cluster's.
    :returns: the replication to wait for, or None when ``WAIT_REPLICAS`` is absent or 0.
    :raises InvalidReplicationOptions: for a bad value.
    """
    where = f"DISTLOCK[{alias!r}]['OPTIONS']"
    replicas = options.get("WAIT_REPLICAS", 0)
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise InvalidReplicationOptions(
            f"{where}['WAIT_REPLICAS'] must be an int (replicas to wait for), got {replicas!r}."
        )
    if not 0 <= replicas <= MAX_REPLICAS:
        raise InvalidReplicationOptions(
            f"{where}['WAIT_REPLICAS'] must be from 0 to {MAX_REPLICAS}, got {replicas}."
        )
    timeout = options.get("WAIT_TIMEOUT", DEFAULT_WAIT)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0.001 <= timeout <= MAX_WAIT
    ):
        raise InvalidReplicationOptions(
            f"{where}['WAIT_TIMEOUT'] must be seconds from 0.001 to {MAX_WAIT:g}, got {timeout!r}."
        )
    if "WAIT_TIMEOUT" in options and not replicas:
        raise InvalidReplicationOptions(f"{where}['WAIT_TIMEOUT'] needs WAIT_REPLICAS.")
    if replicas and cluster:
        raise InvalidReplicationOptions(
            f"{where}['WAIT_REPLICAS'] is for one master and its replicas (with Sentinel), "
            "not a Redis Cluster."
        )
    return Replication(replicas, float(timeout)) if replicas else None


def eval_form(packed: Packed) -> Packed:
    """The same script call sent as ``EVAL`` (with the script's text), not ``EVALSHA``.

    :param packed: a packed ``EVALSHA`` call.
    :returns: its ``EVAL`` form (same keys and arguments).
    """
    form = Packed(packed.script, packed.keys, packed.args)
    parts = ("EVAL", packed.script.text, len(packed.keys), *packed.keys, *packed.args)
    form.head = b"".join(bulk(part) for part in parts)
    return form


class ReplicatedAcquisition(RedisAcquisition):
    """A Redis acquisition whose grants and extensions wait for ``WAIT_REPLICAS``."""

    def __init__(
        self,
        hold: Hold,
        token: str,
        blocking: bool,
        deadline: float | None,
    ) -> None:
        super().__init__(hold, token, blocking, deadline)
        backend = self.backend
        assert backend.replication is not None
        self.replication: Replication = backend.replication
        self.acquire_eval, self.extend_eval = _eval_calls(backend, self.calls)
        #: The socket timeout bounds each read, the ``WAIT``'s reply too (as a block's).
        self.cap = backend.max_block
        self._call, self._block_then_call, self._acall = (
            self._acquire, self._block_then_acquire, self._aacquire
        )

    # -- the acquire's calls (RedisAcquisition's _call, _block_then_call, _acall) ------

    def _acquire(
        self, _packed: Packed, args: tuple[str | int, ...], timeout: float | None
    ) -> Any:
        """The acquire script (as ``EVAL``) and ``WAIT``, written at once.

        :raises NotReplicated: when a grant was not acknowledged (it is undone).
        """
        ms = self.replication.wait_ms(self.deadline, self.hold.ttl, self.cap)
        payload = self.acquire_eval.command(args) + self.replication.command(ms)
        reply, acked = self._exchange(payload, 2, _plus(timeout, ms))
        self._confirm(reply, acked, ms)
        return reply

    def _block_then_acquire(
        self,
        signal: str,
        bound: float,
        _packed: Packed,
        args: tuple[str | int, ...],
        read_timeout: float | None,
    ) -> tuple[int, Any] | None:
        """``TIME``, ``BLPOP``, the acquire script and ``WAIT``, written at once."""
        ms = self.replication.wait_ms(self.deadline, self.hold.ttl, self.cap)
        block = b"*3\r\n$5\r\nBLPOP\r\n%s%s" % (bulk(signal), bulk(f"{bound:.3f}"))
        payload = (
            TIME_COMMAND + block + self.acquire_eval.command(args) + self.replication.command(ms)
        )
        (seconds, micros), _, reply, acked = self._exchange(
            payload, 4, _plus(read_timeout, ms)
        )
        self._confirm(reply, acked, ms)
        return int(seconds) * 1000 + int(micros) // 1000, reply

    async def _aacquire(
        self,
        _packed: Packed,
        args: tuple[str | int, ...],
        deadline: float | None,
        timeout: float | None,
    ) -> Any:
        """Async :meth:`_acquire`."""
        ms = self.replication.wait_ms(self.deadline, self.hold.ttl, self.cap)
        payload = self.acquire_eval.command(args) + self.replication.command(ms)
        reply, acked = await self._aexchange(payload, _plus(timeout, ms), deadline)
        if reply[0] == 1 and acked < self.replication.replicas:
            self._pending = False
            try:
                await self.backend.redis.acall(
                    self.calls.release, (self.token,), None, READ_GRACE
                )
            except (BackendUnavailable, NoConnection):
                self._give_back_later()
            raise self._not_replicated(acked, ms, "grant was undone")
        return reply

    # -- extend: waits too; release does not ------------------------------------

    def extend(self, ttl: float) -> Grant | None:
        payload, ms = self._extension(ttl)
        reply, acked = self._exchange(payload, 2, self._until_lease_end() + ms / 1000)
        return self._extension_result(reply, acked, ms, ttl)

    async def aextend(self, ttl: float) -> Grant | None:
        payload, ms = self._extension(ttl)
        reply, acked = await self._aexchange(payload, self._until_lease_end() + ms / 1000, None)
        return self._extension_result(reply, acked, ms, ttl)

    def _extension(self, ttl: float) -> tuple[bytes, int]:
        """The extend script (as ``EVAL``) and ``WAIT``, packed; and the wait (ms)."""
        ms = self.replication.wait_ms(None, ttl, self.cap)
        args = (self.token, max(int(ttl * 1000), 1))
        return self.extend_eval.command(args) + self.replication.command(ms), ms

    def _extension_result(self, reply: Any, acked: int, ms: int, ttl: float) -> Grant | None:
        """:raises NotReplicated: when an extension made was not acknowledged in time."""
        if reply and acked < self.replication.replicas:
            raise self._not_replicated(acked, ms, "lease keeps its previous end")
        return self._extended(reply, ttl)

    # -- helpers ------------------------------------------------------------------

    def _exchange(self, payload: bytes, replies: int, timeout: float | None) -> list[Any]:
        redis = self.backend.redis
        return redis.wire.exchange(redis.sync().connection_pool, payload, replies, timeout)

    async def _aexchange(
        self, payload: bytes, timeout: float | None, deadline: float | None
    ) -> tuple[Any, int]:
        """Write ``payload`` (a script call and ``WAIT``) on one of the loop's
        connections and read both replies within ``timeout`` seconds.

        :raises NoConnection: when ``deadline`` passed before a connection came free.
        :raises BackendUnavailable: when Redis fails or does not answer in time.
        """
        redis = self.backend.redis
        client = redis.aio()
        async with redis.connection_slot(deadline):
            pool = client.connection_pool
            try:
                conn = await pool.get_connection()
                try:
                    async with asyncio.timeout(timeout):
                        await conn.send_packed_command([payload], check_health=False)
                        reply = await conn.read_response()
                        acked = await conn.read_response()
                except BaseException:
                    await conn.disconnect()  # failed or cancelled mid-reply: out of step
                    raise
                finally:
                    await pool.release(conn)
            except TimeoutError as exc:
                raise did_not_answer(timeout) from exc
            except CLIENT_ERRORS as exc:
                raise REDIS_ERRORS.translate(exc) from exc
        return reply, int(acked)

    def _confirm(self, reply: Any, acked: int, ms: int) -> None:
        """Undo a grant that fewer than ``WAIT_REPLICAS`` replicas acknowledged.

        :raises NotReplicated: then.
        """
        if reply[0] != 1 or acked >= self.replication.replicas:
            return
        self._pending = False  # answered: nothing for close() to give back
        try:
            self.backend.redis.call(self.calls.release, (self.token,), READ_GRACE)
        except BackendUnavailable:
            self._give_back_later()  # tried again until the lease it got has ended
        raise self._not_replicated(acked, ms, "grant was undone")

    def _not_replicated(self, acked: int, ms: int, outcome: str) -> NotReplicated:
        return NotReplicated(
            f"DISTLOCK[{self.backend.alias!r}]: {acked} of the {self.replication.replicas} "
            f"replicas of WAIT_REPLICAS acknowledged within {ms} ms; the {outcome}."
        )


def _plus(timeout: float | None, ms: int) -> float | None:
    """A read timeout that also covers a ``WAIT`` of ``ms`` (None: the socket's)."""
    return None if timeout is None else timeout + ms / 1000


def _eval_calls(backend: RedisBackend, calls: Calls) -> tuple[Packed, Packed]:
    """The ``EVAL`` forms of a lock's acquire and extend calls (memoised per lock)."""
    memo = backend.eval_calls
    found = memo.get(calls.keys.lock)
    if found is None:
        if len(memo) >= _MEMO:
            memo.clear()
        found = memo[calls.keys.lock] = (eval_form(calls.acquire), eval_form(calls.extend))
    return found
