"""The Redis lock backend: settings, listing, force release, health, checks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core import checks
from redis.exceptions import ResponseError

from ...exceptions import (
    BackendUnavailable,
    InvalidBackendOptions,
    LockConfigurationError,
)
from ...kinds import Kind
from ...values import short_owner
from ..base import (
    BaseLockBackend,
    Freed,
    HeldCount,
    LockInfo,
    LockPage,
    WaiterInfo,
    check_option_keys,
)
from .acquisition import SERVER_TICK, Calls, RedisAcquisition
from .batch import run_each
from .caches import cache_problem
from .client import Redis, host_port, socket_timeout
from .errors import REDIS_ERRORS, did_not_answer
from .hub import Hubs
from .keys import Keys, make_keys, tag_base
from .kinds import (
    WRITER,
    RedisKindAcquisition,
    RedisWriteAcquisition,
    kind_calls,
    share_keys,
)
from .kindscripts import KIND_SCRIPTS
from .replication import ReplicatedAcquisition, Replication, replication_options
from .scripts import SCRIPTS
from .sentinel import is_sentinel
from .sentinel import parse as parse_sentinel
from .waiting import read_waiters

#: ``INFO memory``, packed (the eviction check).
INFO_MEMORY = b"*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n"

_OPTIONS = {
    "ALLOW_EVICTION", "CACHE", "CLUSTER", "FAIR", "LISTING", "SHARDS", "WAIT_REPLICAS",
    "WAIT_TIMEOUT",
}
_SCHEMES = ("redis://", "rediss://", "unix://")
#: Index tags of a Redis Cluster by default: the locks spread over this many slots.
CLUSTER_SHARDS = 16
#: Most index entries one listing call looks at (dropping ended leases on the way).
LIST_BUDGET = 2000
#: Most index entries one count script reads (about 10 ms of the server's time).
COUNT_CHUNK = 10_000
_KEYS_CACHE = 4096
#: Most shares (readers, permits) of one name a listing shows.
SHARES_LISTED = 100
#: How a name held in shares starts its ``lock`` string (see :mod:`.kindscripts`).
_SHARE_KINDS = {b"r" * 32 + b" ": "read", b"s" * 32 + b" ": "semaphore"}
#: What to do about a server that evicts keys.
EVICTION_HINT = (
    "Keep the locks on a Redis that does not evict (maxmemory-policy noeviction: it "
    "refuses writes when full, and the backend raises BackendUnavailable), not on a "
    "cache's; or set OPTIONS['ALLOW_EVICTION'] = True to accept the risk."
)
logger = logging.getLogger("django_distlock")


def _location_urls(alias: str, location: object, cluster: bool) -> list[str]:
    """The URLs of ``LOCATION``: one, or a cluster's startup nodes (a list, or one
    string separated by commas)."""
    where = f"DISTLOCK[{alias!r}]['LOCATION']"
    if isinstance(location, str):
        parts = [url.strip() for url in location.split(",")]
        # a comma elsewhere (in a password) is one URL's
        if cluster or any(part.startswith(_SCHEMES) for part in parts[1:]):
            location = parts
    if isinstance(location, list | tuple):
        if not cluster:
            raise InvalidBackendOptions(
                f"{where} lists several URLs, the startup nodes of a Redis Cluster: set "
                "OPTIONS['CLUSTER'] = True, or give one URL."
            )
        urls = list(location)
    else:
        urls = [location]
    if not urls or not all(isinstance(url, str) and url.startswith(_SCHEMES) for url in urls):
        raise InvalidBackendOptions(
            f"{where} must be a redis://, rediss:// or unix:// URL (a Redis Cluster: one "
            f"or more redis:// or rediss:// URLs), got {location!r}."
        )
    if cluster:
        if any(url.startswith("unix://") for url in urls):
            raise InvalidBackendOptions(
                f"{where}: a Redis Cluster's nodes are redis:// or rediss:// URLs "
                f"(redis-py has no cluster over unix sockets), got {location!r}."
            )
        if len({host_port(url) for url in urls}) != len(urls):
            raise InvalidBackendOptions(f"{where} names a node twice: {location!r}.")
    return urls


class RedisBackend(BaseLockBackend):
    """Locks in Redis (one server or a Redis Cluster), through redis-py.

    Configure with ``OPTIONS["CACHE"]``, the alias of a django-redis cache (or
    Django's own ``RedisCache``) whose connection pool it reuses, or with
    ``LOCATION``, a ``redis://``, ``rediss://`` or ``unix://`` URL (with
    ``OPTIONS["CLUSTER"] = True`` for a Redis Cluster, whose ``LOCATION`` may list
    several startup nodes: a list of URLs, or one string separated by commas), or a
    ``redis+sentinel://host:port,host:port/service[/db]`` URL naming Sentinels.
    ``WAIT_REPLICAS`` (default 0) makes every grant wait for that many replicas'
    acknowledgement, at most ``WAIT_TIMEOUT`` seconds (default 1).
    Options: ``FAIR``
    (default True: waiters are served in arrival order), ``SHARDS`` (how
    many hash tags the index of a cluster is spread over; 1 on one server),
    ``LISTING`` (default True; False builds :class:`UnlistedRedisBackend`, which
    keeps no listing index). See ``docs/redis.md``.
    """

    kinds = {
        Kind.EXCLUSIVE: RedisAcquisition,
        Kind.READ: RedisKindAcquisition,
        Kind.WRITE: RedisWriteAcquisition,
        Kind.SEMAPHORE: RedisKindAcquisition,
    }
    errors = REDIS_ERRORS
    distributed = True
    supports_fencing = True
    supports_expiry = True
    supports_leadership = True
    supports_listing = True
    supports_counting = True
    supports_force_release = True
    supports_force_release_by_owner = True
    supports_shared_owner = True
    supports_waiters = True

    def __new__(cls, alias: str, params: Mapping[str, Any]) -> RedisBackend:
        # LISTING and WAIT_REPLICAS change capabilities, so they pick the class
        # (docs/architecture.md); a bad WAIT_REPLICAS is refused by __init__.
        if cls is RedisBackend:
            options = params.get("OPTIONS")
            if isinstance(options, Mapping):
                unlisted = options.get("LISTING") is False
                replicated = options.get("WAIT_REPLICAS", 0) not in (0, None)
                cls = _VARIANTS[unlisted, replicated]
        return super().__new__(cls)

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        options = self.options
        check_option_keys(alias, options, _OPTIONS)
        cache, location = options.get("CACHE"), self.location
        if (cache is None) == (location is None):
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}] needs exactly one of OPTIONS['CACHE'] (a Redis cache "
                f"alias) and LOCATION (a redis:// URL); it has "
                f"{'both' if cache is not None else 'neither'}."
            )
        for flag in ("ALLOW_EVICTION", "CLUSTER", "FAIR", "LISTING"):
            if not isinstance(options.get(flag, False), bool):
                raise InvalidBackendOptions(
                    f"DISTLOCK[{alias!r}]['OPTIONS'][{flag!r}] must be a bool."
                )
        cluster = options.get("CLUSTER", False)
        if is_sentinel(location):
            if cluster:
                raise InvalidBackendOptions(
                    f"DISTLOCK[{alias!r}]: a redis+sentinel:// LOCATION names one master's "
                    "Sentinels, not a Redis Cluster: drop OPTIONS['CLUSTER']."
                )
            parse_sentinel(alias, location)
            urls = [location]
        else:
            urls = _location_urls(alias, location, cluster) if location is not None else []
        #: ``WAIT_REPLICAS``: every grant and extension waits for its replication.
        self.replication: Replication | None = replication_options(alias, options, cluster)
        #: The ``EVAL`` forms of the locks' calls, when grants wait (:mod:`.replication`).
        self.eval_calls: dict[str, tuple[Any, Any]] = {}
        if cluster and cache is not None:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]: OPTIONS['CLUSTER'] needs LOCATION (a cluster node's URL)."
            )
        shards = options.get("SHARDS", CLUSTER_SHARDS if cluster else 1)
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 1024:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['SHARDS'] must be an int from 1 to 1024."
            )
        if "{" in self.key_prefix or "}" in self.key_prefix:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['KEY_PREFIX'] must not contain '{{' or '}}': the "
                "backend chooses the Redis Cluster hash tag of a lock's keys."
            )
        self.cache: str | None = cache
        self.shards: int = shards
        self.fair: bool = options.get("FAIR", True)
        #: Accept a server that may evict lock keys (see :meth:`eviction_problem`).
        self.allow_eviction: bool = options.get("ALLOW_EVICTION", False)
        #: The server was asked whether it evicts keys (or eviction is accepted).
        self.server_checked: bool = self.allow_eviction
        #: ``LISTING``: each grant enters its name in the tag's listing index (a sorted
        #: set: ``ZADD`` on grant, ``ZREM`` on release). Off (:class:`UnlistedRedisBackend`),
        #: the alias saves that entry's memory and server time per lock and cannot list
        #: or count its locks.
        self.listing: bool = options.get("LISTING", self.supports_listing)
        if self.listing != self.supports_listing:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['LISTING'] is {self.listing}, but "
                f"{type(self).__name__} {'lists' if self.supports_listing else 'cannot list'} "
                "its locks: name django_distlock.backends.redis.RedisBackend in BACKEND (it "
                "builds the class of the option), or subclass UnlistedRedisBackend."
            )
        #: The script flags every acquire of this alias sends.
        self.flags = ("f" if self.fair else "") + ("i" if self.listing else "")
        self.redis = Redis(urls[0] if urls else None, cache, cluster, tuple(urls[1:]))
        self.hubs = Hubs()
        self._calls: dict[str, Calls] = {}
        self._kind_calls: dict[tuple[str, bool], Calls] = {}
        self._max_block: float | None = None

    # -- keys ---------------------------------------------------------------

    def keys_for(self, key: str) -> Keys:
        """The Redis keys of the lock with storage key ``key``."""
        return self.calls_for(key).keys

    def calls_for(self, key: str) -> Calls:
        """The keys and packed script calls of the lock with storage key ``key`` (memoised)."""
        calls = self._calls.get(key)
        if calls is None:
            if len(self._calls) >= _KEYS_CACHE:
                self._calls.clear()
            keys = make_keys(self.key_prefix, key[len(self.key_prefix) :], self.shards)
            calls = self._calls[key] = Calls.of(keys, self.listing)
        return calls

    def kind_calls_for(self, key: str, writer: bool) -> Calls:
        """The packed script calls of a read lock or semaphore, or of a write lock
        (memoised).

        :param key: the lock's storage key.
        :param writer: a write lock's.
        :returns: the calls (see :func:`.kinds.kind_calls`).
        """
        calls = self._kind_calls.get((key, writer))
        if calls is None:
            if len(self._kind_calls) >= _KEYS_CACHE:
                self._kind_calls.clear()
            calls = self._kind_calls[key, writer] = kind_calls(self.keys_for(key), writer)
        return calls

    @property
    def max_block(self) -> float:
        """Longest ``BLPOP`` the client's socket timeout allows (none: no limit): Redis
        may end a block one timer tick late, and the reply must come before the
        socket times out."""
        if self._max_block is None:
            timeout = socket_timeout(self.redis.sync())
            self._max_block = (
                float("inf") if timeout is None else max(timeout - SERVER_TICK - 0.05, 0.0)
            )
        return self._max_block

    # -- the contract -----------------------------------------------------------

    def eviction_problem(self, timeout: float | None = None) -> str | None:
        """Ask the server (each master of a cluster) whether it may evict keys when
        full, which takes held locks' keys too (a lease has a TTL: the volatile
        policies take it as well); say why it is unsafe, or None.

        :param timeout: the longest the reply is awaited, in seconds (None: the
            socket's timeout); a cluster's masters are asked through redis-py.
        :raises BackendUnavailable: when the server fails or does not answer in time.
        """
        client = self.redis.sync()
        try:
            if self.redis.cluster:
                found = self.redis.command("info", "memory", target_nodes=client.PRIMARIES)
            else:
                found = {"": self._info_memory(client, timeout)}
        except BackendUnavailable as exc:
            if not isinstance(exc.__cause__, ResponseError):
                raise
            # INFO disabled (renamed): it cannot be known
            logger.warning(
                "DISTLOCK[%r]: Redis refused INFO; cannot tell whether it evicts lock keys.",
                self.alias,
            )
            return None
        for node, info in found.items():
            policy, limit = str(info.get("maxmemory_policy")), int(info.get("maxmemory", 0))
            if policy != "noeviction" and limit > 0:
                where = f"Redis {node}" if node else "Redis"
                return (
                    f"{where} evicts keys when full (maxmemory {limit} bytes, maxmemory-policy "
                    f"{policy}): it can evict a held lock's key and grant the lock to a second "
                    "holder."
                )
        return None

    def _info_memory(self, client: Any, timeout: float | None) -> dict[str, Any]:
        """``INFO memory`` on the kept connections of the hot path, its reply awaited at
        most ``timeout`` seconds (redis-py's own ``info()`` waits for the socket's
        timeout: none by default, so a frozen server held the first acquire for ever).

        :raises BackendUnavailable: when Redis fails, or refuses ``INFO`` (chained to
            its ``ResponseError``).
        """
        raw = self.redis.wire.exchange(client.connection_pool, INFO_MEMORY, 1, timeout)[0]
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line
                    and not line.startswith("#"))

    def ensure_checked(self, timeout: float | None = None) -> None:
        """The first attempt of this alias in the process (and the first after a
        refusal) asks whether the server evicts keys (:meth:`_check_server`).

        :param timeout: the longest the answer is awaited, in seconds.
        :raises LockConfigurationError: when it does.
        :raises BackendUnavailable: when the server fails or does not answer in time.
        """
        if not self.server_checked:
            self._check_server(timeout)

    async def aensure_checked(self, timeout: float) -> None:
        """:meth:`ensure_checked` for an event loop: the check (a blocking ``INFO``) runs
        in a worker thread, awaited at most ``timeout`` seconds, so neither the loop nor
        the acquire waits on a server that does not answer.

        :raises LockConfigurationError: when the server evicts keys.
        :raises BackendUnavailable: when it fails or does not answer in time.
        """
        if self.server_checked:
            return
        try:
            async with asyncio.timeout(timeout):
                await asyncio.to_thread(self._check_server, timeout)
        except TimeoutError as exc:
            raise did_not_answer(timeout, "INFO") from exc

    def _check_server(self, timeout: float | None = None) -> None:
        """The first acquire of this alias in the process asks whether the server
        evicts keys (one round trip, once; again after a refusal).

        :raises LockConfigurationError: when it does.
        """
        problem = self.eviction_problem(timeout)
        if problem is not None:
            raise LockConfigurationError(f"DISTLOCK[{self.alias!r}]: {problem} {EVICTION_HINT}")
        self.server_checked = True

    def is_locked(self, name: str) -> bool:
        keys = self.keys_for(self.make_key(name))
        return bool(self.redis.command("exists", keys.lock))

    def _count_held(self, prefix: str, limit: int) -> HeldCount:
        # Read-only scripts per tag, each reading at most COUNT_CHUNK index entries (so no
        # call holds the server long, whatever the cap): each entry's lock key checked, up
        # to the cap (entries of ended leases stay in the index until a listing passes
        # them, so the entries alone are only a ceiling); a budget bounds a tag full of
        # ended entries.
        low = b"[" + prefix.encode()
        high = b"[" + prefix.encode() + b"\xff" if prefix else b"+"
        found, whole, ceiling = 0, True, 0
        for tag in range(self.shards):
            base = tag_base(self.key_prefix, tag)
            budget, start, first = limit - found + LIST_BUDGET, low, 1
            while True:
                counted, done, last, read, entries = self.redis.run(
                    SCRIPTS["count"],
                    (base + "i",),
                    (base, start, high, limit - found, min(COUNT_CHUNK, budget), first),
                )
                found, ceiling = found + int(counted), ceiling + int(entries)
                budget -= int(read)
                if done or found > limit:
                    whole = whole and bool(done) and found <= limit
                    break
                if budget <= 0:
                    whole = False
                    break
                start, first = b"(" + (last if isinstance(last, bytes) else last.encode()), 0
            if found > limit:
                break
        if whole:
            return HeldCount(found, True)
        return HeldCount(min(found, limit), False, None if found > limit else ceiling)

    def _held_locks(self, prefix: str, limit: int, cursor: str | None) -> LockPage:
        try:
            after = bytes.fromhex(cursor) if cursor is not None else None
        except ValueError as exc:
            raise ValueError(
                "cursor must be a next_cursor value returned by held_locks()."
            ) from exc
        low = b"(" + after if after is not None else b"[" + prefix.encode()
        high = b"[" + prefix.encode() + b"\xff" if prefix else b"+"
        found: list[tuple[bytes, bytes, int, int]] = []
        # A tag that stopped before the end of the range (page full, or budget spent on
        # ended leases) has looked up to its `last` member only: the page cannot go past
        # the smallest such member, or it would skip that tag's locks after it.
        cutoff: bytes | None = None
        # Every tag's call at once (one pipeline: a round trip per node, not per tag).
        bases = [tag_base(self.key_prefix, tag) for tag in range(self.shards)]
        calls = [((base + "i",), (base, low, high, limit, LIST_BUDGET)) for base in bases]
        for *flat, last in run_each(self.redis, SCRIPTS["list"], calls):
            # A URL with decode_responses=True has redis-py decode the reply to str.
            found.extend(
                (_as_bytes(flat[i]), _as_bytes(flat[i + 1]), flat[i + 2], flat[i + 3])
                for i in range(0, len(flat), 4)
            )
            if last:
                last = _as_bytes(last)
                cutoff = last if cutoff is None else min(cutoff, last)
        found.sort()
        if cutoff is not None:
            found = [item for item in found if item[0] <= cutoff]
        page = found[:limit]
        if len(found) > limit:
            next_cursor: str | None = page[-1][0].hex()
        else:
            next_cursor = cutoff.hex() if cutoff is not None else None
        infos: list[LockInfo] = []
        for member, held, pttl, waiters in page:
            kind = _SHARE_KINDS.get(held[:33])
            if kind is None:
                infos.append(self._info(member, held, pttl, waiters))
            else:  # readers or permits: one more call, for the shares of this name
                infos.extend(self._shares(member, kind, waiters))
        return LockPage(infos, next_cursor)

    def _shares(self, member: bytes, kind: str, waiters: int) -> list[LockInfo]:
        """One row per reader (or permit) of the name stored as ``member``."""
        keys = make_keys(self.key_prefix, member.decode(), self.shards)
        flat = self.redis.run(KIND_SCRIPTS["shares"], share_keys(keys), (SHARES_LISTED,))
        rows = []
        for i in range(0, len(flat), 3):
            token, data = _as_bytes(flat[i]), _as_bytes(flat[i + 2])
            held = token + b" 1 " + data
            rows.append(self._info(member, held, flat[i + 1], waiters, kind))
        return rows

    def _info(
        self, member: bytes, held: bytes, pttl: int, waiters: int, kind: str = "exclusive"
    ) -> LockInfo:
        text = held.decode()
        token, _count, fencing, acquired, meta = text.split(" ", 4)
        host, pid, thread = ([*meta.split(" ", 2), "", ""])[:3]
        if host.startswith(WRITER):
            kind, host = "write", host[len(WRITER) :]
        return LockInfo(
            alias=self.alias,
            name=self.name_of(self.key_prefix + member.decode()),
            owner=short_owner(token),
            fencing_token=int(fencing),
            acquired_at=datetime.fromtimestamp(int(acquired) / 1000, UTC),
            expires_at=datetime.now(UTC) + timedelta(milliseconds=max(pttl, 0)),
            host=host,
            pid=int(pid) if pid.isdigit() else None,
            thread=thread,
            waiters=waiters,
            kind=kind,
        )

    def _waiters(self, key: str, limit: int) -> list[WaiterInfo]:
        return read_waiters(self, key, limit)

    def _force_release(self, key: str, owner: str) -> Freed | None:
        keys = self.keys_for(key)
        # The kinds' script: it frees an exclusive holder (or writer) as the exclusive
        # lock's does, and readers or permits (the given owner's, or all).
        fencing = self.redis.run(
            KIND_SCRIPTS["force_release"],
            (keys.lock, keys.queue, keys.waiters, keys.listing, *share_keys(keys)),
            (keys.member, owner),
        )
        return Freed(fencing) if fencing else None

    def health(self) -> float:
        """The latency of a ``PING``.

        :raises BackendUnavailable: when the server fails.
        :raises LockConfigurationError: when it may evict lock keys (unless
            ``ALLOW_EVICTION``).
        """
        started = time.monotonic()
        self.redis.command("ping")
        latency = time.monotonic() - started
        if not self.allow_eviction:
            problem = self.eviction_problem()
            if problem is not None:
                raise LockConfigurationError(
                    f"DISTLOCK[{self.alias!r}]: {problem} {EVICTION_HINT}"
                )
        return latency

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        if kwargs.get("deploy"):
            return self._deploy_check()
        if self.cache is None:
            return []
        problem = cache_problem(self.cache)
        if problem is None:
            return []
        return [
            checks.Error(
                f"DISTLOCK[{self.alias!r}]: {problem}",
                hint="Name a django-redis (or django.core.cache.backends.redis) cache, or "
                "give LOCATION instead.",
                obj=self.alias,
                id="distlock.E010",
            )
        ]

    def _deploy_check(self) -> list[checks.CheckMessage]:
        """``check --deploy``: ask the server whether it evicts keys (one round trip)."""
        if self.allow_eviction:
            return []
        try:
            problem = self.eviction_problem()
        except (BackendUnavailable, LockConfigurationError) as exc:
            return [
                checks.Warning(
                    f"DISTLOCK[{self.alias!r}]: could not ask Redis whether it evicts lock "
                    f"keys: {exc}",
                    hint="Run the check where the server can be reached.",
                    obj=self.alias,
                    id="distlock.W011",
                )
            ]
        if problem is None:
            return []
        return [
            checks.Error(
                f"DISTLOCK[{self.alias!r}]: {problem}",
                hint=EVICTION_HINT,
                obj=self.alias,
                id="distlock.E011",
            )
        ]

    def close(self) -> None:
        self.redis.close()


_NO_INDEX = "OPTIONS['LISTING'] is False: its grants keep no listing index"


class UnlistedRedisBackend(RedisBackend):
    """A Redis alias with ``OPTIONS["LISTING"] = False`` (:class:`RedisBackend` builds
    it for that option): a grant enters no listing index, which saves about 110 bytes
    of Redis memory per held lock and two commands per acquire and release, and the
    alias cannot list or count its locks."""

    supports_listing = False
    supports_counting = False
    why_unsupported = {"supports_listing": _NO_INDEX, "supports_counting": _NO_INDEX}


_EXCLUSIVE_ONLY = (
    "OPTIONS['WAIT_REPLICAS'] covers exclusive locks only (use an alias without "
    "WAIT_REPLICAS for read-write locks and semaphores)"
)


class ReplicatedRedisBackend(RedisBackend):
    """A Redis alias with ``OPTIONS["WAIT_REPLICAS"]`` (:class:`RedisBackend` builds it
    for that option): every grant and extension of its exclusive locks waits for that
    many replicas (:mod:`.replication`); it serves no other kind."""

    kinds = {Kind.EXCLUSIVE: ReplicatedAcquisition}
    why_unsupported = {
        "supports_read_write": _EXCLUSIVE_ONLY,
        "supports_semaphore": _EXCLUSIVE_ONLY,
    }


class UnlistedReplicatedRedisBackend(UnlistedRedisBackend, ReplicatedRedisBackend):
    """``LISTING = False`` and ``WAIT_REPLICAS`` together."""

    why_unsupported = {
        **UnlistedRedisBackend.why_unsupported, **ReplicatedRedisBackend.why_unsupported
    }


#: The class of (LISTING is False, WAIT_REPLICAS given).
_VARIANTS: dict[tuple[bool, bool], type[RedisBackend]] = {
    (False, False): RedisBackend,
    (True, False): UnlistedRedisBackend,
    (False, True): ReplicatedRedisBackend,
    (True, True): UnlistedReplicatedRedisBackend,
}


def _as_bytes(value: bytes | str) -> bytes:
    """A reply's string as bytes, whether or not the client decodes replies."""
    return value.encode() if isinstance(value, str) else value
