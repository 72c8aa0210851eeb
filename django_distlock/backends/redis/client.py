"""The Redis side of the backend: which server, the clients (sync, and async per
event loop), and the calls that run a packed script on a connection.

The backend (settings, API) is :mod:`.backend`; the keys and packed calls are
:mod:`.keys`; the reused caches are :mod:`.caches`; this module owns connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import NoScriptError
from redis.utils import get_lib_version

from ...backoff import remaining
from ...exceptions import BackendUnavailable
from .caches import async_client_like, cache_client
from .errors import CLIENT_ERRORS, REDIS_ERRORS, did_not_answer
from .keys import TIME_COMMAND, Packed, bulk
from .scripts import Script
from .sentinel import close_sentinels, is_sentinel, master_client
from .wire import KeptConnections, Sent

_resolve_driver_info: Any
_SENTINEL: Any
try:  # redis-py 8.1+: where a connection resolves its driver's name and version
    from redis.driver_info import resolve_driver_info as _resolve_driver_info
    from redis.utils import SENTINEL as _SENTINEL
except ImportError:  # pragma: no cover - an older redis-py
    _resolve_driver_info = _SENTINEL = None
#: redis-py's version as it reports it to the server, read from its metadata once.
_lib_version = functools.cache(get_lib_version)

__all__ = [
    "NoConnection",
    "Redis",
    "Sent",
    "host_port",
    "node_url",
    "socket_timeout",
]

#: Connections per loop when the client is a cluster's (redis.asyncio's default per node).
CLUSTER_NODE_CONNECTIONS = 100
#: Most calls of one event loop in flight at once (fewer if the pool is smaller). Replies
#: that arrive together are handled in one turn of the loop, so this bounds the turn:
#: with 100 (redis-py's pool) a thousand tasks starting at once kept the loop busy 7-9 ms
#: a turn for their first 200 ms (the loop's lag p99 over 5 ms; 2.5-4 ms with 16, at the
#: same rate: Redis answers one call at a time anyway).
ASYNC_CALLS = 16
#: Longest a call without a deadline waits for one of the event loop's connections.
POOL_WAIT = 20.0


class NoConnection(Exception):
    """The deadline passed while the call waited for a free connection: nothing was sent."""


class Redis:
    """The clients of one alias in this process.

    :param location: a ``redis://``, ``rediss://``, ``unix://`` or ``redis+sentinel://``
        URL, or None.
    :param cache: the alias of a Redis cache in ``CACHES`` whose pool is reused, or None.
    :param cluster: whether ``location`` names a Redis Cluster.
    :param more_nodes: more startup nodes of the cluster (URLs; their host and port
        are used, the connection options are ``location``'s).
    """

    def __init__(
        self,
        location: str | None,
        cache: str | None,
        cluster: bool,
        more_nodes: tuple[str, ...] = (),
    ) -> None:
        self.location = location
        self.cache = cache
        self.cluster = cluster
        self.more_nodes = tuple(host_port(url) for url in more_nodes)
        self._sync: Any = None
        self._mutex = threading.Lock()
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._async_pubsub: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        #: The hot path's connections, kept between calls (:mod:`.wire`).
        self.wire = KeptConnections()
        _lib_version()  # now, not on an event loop (see pin_driver_info)
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        #: The server's clock (ms) less this process' ``time.monotonic()`` (ms), or None
        #: before it is measured. Taken as the server's time against when its reply
        #: arrived, it is never ahead of the truth: a server time computed from it for a
        #: moment of this process comes at or before that moment.
        self.offset: float | None = None

    # -- clients ------------------------------------------------------------

    def sync(self) -> Any:
        """The sync client (redis-py resets its pools in a forked child).

        :raises BackendUnavailable: when a cluster client finds no startup node.
        """
        client = self._sync
        if client is None:
            with self._mutex:
                if self._sync is None:
                    try:
                        self._sync = self._build_sync()
                    except CLIENT_ERRORS as exc:  # a cluster client connects at once
                        raise REDIS_ERRORS.translate(exc, "connecting") from exc
                client = self._sync
        return client

    def _build_sync(self) -> Any:
        if self.cache is not None:
            return cache_client(self.cache)
        assert self.location is not None
        if is_sentinel(self.location):
            return master_client(self.location)
        if self.cluster:
            nodes = [redis.cluster.ClusterNode(host, port) for host, port in self.more_nodes]
            return redis.cluster.RedisCluster.from_url(self.location, startup_nodes=nodes)
        return redis.Redis.from_url(self.location)

    def aio(self) -> Any:
        """The async client of the running event loop."""
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            client = self._async[loop] = self._build_async()
            pin_driver_info(client)
            # redis.asyncio refuses a call when all its connections are busy
            # (MaxConnectionsError); the loop's calls queue for them here instead, at
            # most ASYNC_CALLS of them in flight.
            pool = getattr(client, "connection_pool", None)
            size = pool.max_connections if pool is not None else CLUSTER_NODE_CONNECTIONS
            self._slots[loop] = asyncio.Semaphore(min(size, ASYNC_CALLS))
        return client

    def aio_pubsub(self) -> list[Any]:
        """The async clients the loop's wake-up hub subscribes with, in the order it
        tries them: their own pools, so the subscription never takes a connection the
        calls count on. One, or for a cluster, a plain client per startup node: a
        ``PUBLISH`` on any node reaches the subscribers of every node."""
        loop = asyncio.get_running_loop()
        clients = self._async_pubsub.get(loop)
        if clients is None:
            if self.cluster:
                assert self.location is not None
                clients = [redis.asyncio.Redis.from_url(self.location)] + [
                    redis.asyncio.Redis.from_url(node_url(self.location, host, port))
                    for host, port in self.more_nodes
                ]
            else:
                clients = [self._build_async()]
            for client in clients:
                pin_driver_info(client)
            self._async_pubsub[loop] = clients
        return clients

    @contextlib.asynccontextmanager
    async def connection_slot(self, deadline: float | None) -> AsyncIterator[None]:
        """Hold one of the event loop's connections for one call; wait for a free one
        until ``deadline`` (then :class:`NoConnection`) or :data:`POOL_WAIT`."""
        slots = self._slots[asyncio.get_running_loop()]
        if slots.locked():
            left = remaining(deadline)
            try:
                async with asyncio.timeout(POOL_WAIT if left is None else max(left, 0.0)):
                    await slots.acquire()
            except TimeoutError:
                if left is not None:
                    raise NoConnection from None
                raise BackendUnavailable(
                    f"No Redis connection of this event loop came free within {POOL_WAIT} s: "
                    f"all of its {ASYNC_CALLS} calls in flight (or its pool's max_connections, "
                    "if fewer) stayed busy."
                ) from None
        else:
            await slots.acquire()  # free: returns at once
        try:
            yield
        finally:
            slots.release()

    def _build_async(self) -> Any:
        if self.location is not None:
            if is_sentinel(self.location):
                return master_client(self.location, asyncio=True)
            if self.cluster:
                nodes = [
                    redis.asyncio.cluster.ClusterNode(host, port) for host, port in self.more_nodes
                ]
                return redis.asyncio.cluster.RedisCluster.from_url(
                    self.location, startup_nodes=nodes
                )
            return redis.asyncio.Redis.from_url(self.location)
        assert self.cache is not None
        return async_client_like(self.sync().connection_pool, self.cache)

    def close(self) -> None:
        """Give back the kept connections; disconnect the sync pool this alias built
        (a cache's pool is the cache's)."""
        client, self._sync = self._sync, None
        wire, self.wire = self.wire, KeptConnections()
        if client is None:
            return
        pool = getattr(client, "connection_pool", None)
        if pool is not None:  # a cluster client's calls keep none
            wire.give_back(pool)
        if self.cache is None:
            client.close()
            if is_sentinel(self.location):
                close_sentinels(client)

    # -- calls ----------------------------------------------------------------

    def call(
        self, packed: Packed, args: tuple[str | int, ...], timeout: float | None = None,
        spare: bool = False,
    ) -> Any:
        """Run a pre-packed script call with its per-call ``args``: one send, one read
        on a kept connection, none of redis-py's per-command wrapper work (the hot
        path: acquire and release), the reply awaited at most ``timeout`` seconds.
        A cluster client takes :meth:`run`'s way. ``spare``: a holder's release or
        extend, which may take a connection outside a full pool (``Wire.exchange``).

        :raises BackendUnavailable: when Redis fails or does not answer in time.
        """
        client = self.sync()
        pool = getattr(client, "connection_pool", None)
        if pool is None:  # RedisCluster: it routes by the keys
            return self.run(packed.script, packed.keys, (*packed.args, *args))
        try:
            return self.wire.exchange(pool, packed.command(args), 1, timeout, spare)[0]
        except NoScriptError:  # EVAL loads the script
            return self._eval(client, packed.script, packed.keys, (*packed.args, *args))

    def start(self, packed: Packed, args: tuple[str | int, ...]) -> Sent:
        """Write a packed call and return without its reply (one server's share of a
        call made on several at once); :meth:`finish` reads it. Not for a cluster.

        :raises BackendUnavailable: when Redis fails.
        """
        return self.wire.send(self.sync().connection_pool, packed.command(args))

    def finish(
        self, sent: Sent, packed: Packed, args: tuple[str | int, ...], timeout: float | None
    ) -> Any:
        """The reply of :meth:`start`'s call (``NOSCRIPT``: made again with ``EVAL``).

        :raises BackendUnavailable: when Redis fails.
        """
        try:
            return self.wire.receive(sent, 1, timeout)[0]
        except NoScriptError:
            return self._eval(self.sync(), packed.script, packed.keys, (*packed.args, *args))

    def observe(self, server_ms: int) -> None:
        """Take the offset from a server time (ms) in a reply that just arrived."""
        self.offset = server_ms - time.monotonic() * 1000

    def server_time(self, local: float) -> int:
        """The server's time in ms at ``local`` (a ``time.monotonic()`` value), or at
        most that: 0 when the offset was never measured."""
        offset = self.offset
        return 0 if offset is None else int(local * 1000 + offset)

    def measure(self, timeout: float) -> None:
        """Measure :attr:`offset` (one ``TIME``) unless known; nothing for a cluster,
        whose nodes each have a clock.

        :raises BackendUnavailable: when Redis fails or does not answer in time.
        """
        if self.offset is not None or self.cluster:
            return
        (seconds, micros), = self.wire.exchange(
            self.sync().connection_pool, TIME_COMMAND, 1, timeout
        )
        self.observe(int(seconds) * 1000 + int(micros) // 1000)

    async def ameasure(self, deadline: float | None, timeout: float) -> None:
        """Async :meth:`measure`."""
        if self.offset is not None or self.cluster:
            return
        client = self.aio()
        async with self.connection_slot(deadline):
            try:
                async with asyncio.timeout(timeout):
                    seconds, micros = await client.time()
            except TimeoutError as exc:
                raise did_not_answer(timeout) from exc
            except CLIENT_ERRORS as exc:
                raise REDIS_ERRORS.translate(exc) from exc
        self.observe(int(seconds) * 1000 + int(micros) // 1000)

    def block_then_call(
        self,
        key: str,
        timeout: float,
        packed: Packed,
        args: tuple[str | int, ...],
        read_timeout: float | None = None,
    ) -> tuple[int, Any] | None:
        """``TIME``, ``BLPOP key timeout`` and the packed call, written at once: Redis
        runs the call the moment the block ends, so a waiter woken by a release has
        its next attempt's reply in the same read (no round trip after the wake).
        (The backend's ``max_block`` keeps the block shorter than the socket timeout.)

        Returns the server's clock in ms before the block and the call's reply, or
        None (the caller attempts again) for a cluster client, which only blocks, and
        for a miss after ``NOSCRIPT``.

        :raises BackendUnavailable: when Redis fails.
        """
        client = self.sync()
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            self.command("blpop", [key], timeout=timeout)
            return None
        block = b"*3\r\n$5\r\nBLPOP\r\n%s%s" % (bulk(key), bulk(f"{timeout:.3f}"))
        try:
            (seconds, micros), _, reply = self.wire.exchange(
                pool, TIME_COMMAND + block + packed.command(args), 3, read_timeout
            )
        except NoScriptError:
            reply = self._eval(client, packed.script, packed.keys, (*packed.args, *args))
            return None if reply[0] != 1 else (int(reply[3]), reply)
        return int(seconds) * 1000 + int(micros) // 1000, reply

    async def acall(
        self,
        packed: Packed,
        args: tuple[str | int, ...],
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Async :meth:`call`; waits for a free connection of the loop until ``deadline``,
        then for the reply at most ``timeout`` seconds.

        :raises NoConnection: when ``deadline`` passed first (nothing was sent).
        :raises BackendUnavailable: when Redis fails or does not answer in time.
        """
        client = self.aio()
        async with self.connection_slot(deadline):
            try:
                async with asyncio.timeout(timeout):
                    return await self._acall(client, packed, args)
            except TimeoutError as exc:
                raise did_not_answer(timeout) from exc

    async def _acall(self, client: Any, packed: Packed, args: tuple[str | int, ...]) -> Any:
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            return await self._arun(client, packed.script, packed.keys, (*packed.args, *args))
        try:
            conn = await pool.get_connection()
            try:
                await conn.send_packed_command([packed.command(args)], check_health=False)
                return await conn.read_response()
            except NoScriptError:
                pass
            except BaseException:
                await conn.disconnect()  # failed or cancelled mid-reply: out of step
                raise
            finally:
                await pool.release(conn)
            return await client.execute_command(
                "EVAL", packed.script.text, len(packed.keys), *packed.keys, *packed.args, *args
            )
        except CLIENT_ERRORS as exc:
            raise REDIS_ERRORS.translate(exc) from exc

    def run(self, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        """Run ``script`` by SHA; load it on ``NOSCRIPT`` (flushed, restarted, failed
        over) and run it again, once.

        :raises BackendUnavailable: when Redis fails.
        """
        client = self.sync()
        try:
            return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return self._eval(client, script, keys, args)
        except CLIENT_ERRORS as exc:
            raise REDIS_ERRORS.translate(exc) from exc

    def command(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """The sync client's method ``name`` called with ``args`` (``"exists"``,
        ``"ping"``, ``"info"``: the calls off the hot path that are not scripts).

        :raises BackendUnavailable: when Redis fails.
        """
        try:
            return getattr(self.sync(), name)(*args, **kwargs)
        except CLIENT_ERRORS as exc:
            raise REDIS_ERRORS.translate(exc) from exc

    @staticmethod
    def _eval(client: Any, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        """``EVAL`` (runs the script and loads it), after a ``NOSCRIPT``."""
        try:
            return client.execute_command("EVAL", script.text, len(keys), *keys, *args)
        except CLIENT_ERRORS as exc:
            raise REDIS_ERRORS.translate(exc) from exc

    async def arun(self, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        """Async :meth:`run`."""
        client = self.aio()
        async with self.connection_slot(None):
            return await self._arun(client, script, keys, args)

    async def _arun(
        self, client: Any, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]
    ) -> Any:
        try:
            if self.cluster:
                # Tasks that find the cluster client unready and all ready it at once
                # break its connections (redis-py 8.1); initialize() serialises them.
                await client.initialize()
            try:
                return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                return await client.execute_command("EVAL", script.text, len(keys), *keys, *args)
        except CLIENT_ERRORS as exc:
            raise REDIS_ERRORS.translate(exc) from exc


def pin_driver_info(client: Any) -> None:
    """Resolve once, for every connection of ``client``'s pool, the name and version that
    redis-py sends on connect (``CLIENT SETINFO``).

    Left to each connection, redis-py resolves them in the connection's constructor by
    reading its package's metadata from disk (``importlib.metadata.version``): a file read
    and a parse of about a millisecond, on the event loop's thread, for every connection
    an async pool opens (a thousand tasks starting at once open a pool's worth). The
    values are the same (``lib_name`` / ``lib_version`` given in the URL are kept); a
    cluster client's node pools are built by the cluster and are left as they are.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None or _resolve_driver_info is None:
        return
    kwargs = pool.connection_kwargs
    if "driver_info" in kwargs:
        return
    version = kwargs.pop("lib_version", _SENTINEL)
    kwargs["driver_info"] = _resolve_driver_info(
        _SENTINEL, kwargs.pop("lib_name", _SENTINEL),
        _lib_version() if version is _SENTINEL else version,
    )


def socket_timeout(client: Any) -> float | None:
    """The socket timeout of ``client``'s connections (None: none, or a cluster's)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return None
    given = pool.connection_kwargs
    timeout = given.get("socket_timeout", given.get("orig_socket_timeout"))
    return float(timeout) if timeout else None


def host_port(url: str) -> tuple[str, int]:
    """The host and port a ``redis://`` or ``rediss://`` URL names (6379 by default)."""
    parts = urlsplit(url)
    return parts.hostname or "localhost", parts.port or 6379


def node_url(url: str, host: str, port: int) -> str:
    """``url`` (its scheme, credentials and options) for the node ``host:port``."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{credentials}@{where}" if credentials else where))
