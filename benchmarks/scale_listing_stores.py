"""The stores of ``scale.listing`` (``benchmarks/scale_listing.py``): per backend, its alias
and how its stored form of ``count`` held locks is written in bulk, and removed."""

from __future__ import annotations

import contextlib
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

#: ``KEY_PREFIX`` of this suite's aliases: its Redis keys and lock rows start with it.
PREFIX = "scalelist:"
NAME = "lock:{:07d}"
TTL_MS = 3_600_000
#: ZooKeeper's largest size: 2 znodes per lock, the ensemble's servers have 256 MB heaps.
ZK_MAX = 100_000
ZK_PER_SESSION = 4000
ZK_BASE = "/distlock-scale-listing"
_DB = "django_distlock.backends.database.DatabaseBackend"
_REDIS = "django_distlock.backends.redis.RedisBackend"


def names(count: int) -> Iterator[str]:
    """The names of ``count`` locks, in key order."""
    return (NAME.format(i) for i in range(count))


class Target:
    """One backend: its alias settings, and how its stored form is written and removed."""

    alias = ""
    #: The environment variable naming its server.
    variable = ""
    largest = 10**9
    #: Why not more than ``largest``.
    why_largest = ""
    why_not = ""  # why the backend cannot list ("": it can)

    def entry(self) -> dict[str, Any]:
        """The ``DISTLOCK`` entry of its alias."""
        raise NotImplementedError

    def databases(self) -> dict[str, Any]:
        """``DATABASES`` entries the admin's process needs besides its own."""
        return {}

    def page_entry(self) -> dict[str, Any]:
        return self.entry()

    def fill(self, backend: Any, count: int) -> None:
        raise NotImplementedError

    def read_all(self, backend: Any) -> Callable[[], Any] | None:
        """The read of every lock a page makes, if the backend makes one (timed apart)."""
        return None

    def clear(self, backend: Any, count: int) -> None:
        raise NotImplementedError


def _holder(i: int) -> tuple[str, str]:
    return f"{random.getrandbits(128):032x}", f"bench-host {4000 + i % 100} MainThread"


class RedisTarget(Target):
    """What the acquire script writes on a grant: ``SET lock "token 1 fencing acquired_ms
    meta" PX ttl`` and ``ZADD index 0 member`` (``backends/redis/scripts.py``)."""

    alias, variable = "scale-redis", "DISTLOCK_REDIS_URL"

    def entry(self) -> dict[str, Any]:
        return {"BACKEND": _REDIS, "LOCATION": os.environ[self.variable], "KEY_PREFIX": PREFIX}

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(os.environ[self.variable])

    def _batches(self, backend: Any, count: int) -> Iterator[list[Any]]:
        from django_distlock.backends.redis.keys import make_keys

        batch: list[Any] = []
        for name in names(count):
            batch.append(make_keys(backend.key_prefix, name, backend.shards))
            if len(batch) == 5000:
                yield batch
                batch = []
        if batch:
            yield batch

    def fill(self, backend: Any, count: int) -> None:
        client, now_ms = self.client(), int(time.time() * 1000)
        for batch in self._batches(backend, count):
            pipe, index = client.pipeline(transaction=False), {}
            for keys in batch:
                token, meta = _holder(len(index))
                pipe.set(keys.lock, f"{token} 1 {now_ms * 1000 + random.randrange(1000)} "
                         f"{now_ms} {meta}", px=TTL_MS)
                index.setdefault(keys.listing, {})[keys.member] = 0
            for key, members in index.items():
                pipe.zadd(key, members)
            pipe.execute()
        client.close()

    def clear(self, backend: Any, count: int) -> None:
        client = self.client()
        for batch in self._batches(backend, count):
            pipe = client.pipeline(transaction=False)
            for keys in batch:
                pipe.unlink(keys.lock)
            pipe.execute()
        from django_distlock.backends.redis.keys import tag_base

        for tag in range(backend.shards):
            client.unlink(tag_base(backend.key_prefix, tag) + "i")
        client.close()


class ClusterTarget(RedisTarget):
    """The same on a Redis Cluster (16 index tags; a cluster pipeline sends each node its
    commands)."""

    alias, variable = "scale-redis-cluster", "DISTLOCK_REDIS_CLUSTER_URL"

    def entry(self) -> dict[str, Any]:
        return {**super().entry(), "OPTIONS": {"CLUSTER": True}}

    def client(self) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(os.environ[self.variable])


class PgTarget(Target):
    """Lease-mode rows (the columns ``sql.POSTGRESQL.acquire`` writes on a grant) in the
    benchmark database's lock table, one ``INSERT ... SELECT generate_series``."""

    alias, variable = "scale-pg", "DISTLOCK_PG_PORT"

    def entry(self) -> dict[str, Any]:
        return {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default"}, "KEY_PREFIX": PREFIX}

    def databases(self) -> dict[str, Any]:
        from django.conf import settings

        db = settings.DATABASES["default"]
        return {"pg": {k: db[k] for k in ("ENGINE", "HOST", "PORT", "USER", "NAME")}}

    def page_entry(self) -> dict[str, Any]:
        return {**self.entry(), "OPTIONS": {"DATABASE": "pg"}}

    def fill(self, backend: Any, count: int) -> None:
        from django_distlock.backends.database.sql import HIGH_WATER

        from . import pg

        # A new row's token starts above the pruned rows' high-water mark (migration
        # 0011's trigger, per row): read once here, the trigger off for this transaction
        # (its plan, made while the table was small, scans the table: quadratic here).
        with pg.connect() as conn, conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                "INSERT INTO django_distlock_lock (name, owner, fencing, acquired_at,"
                " expires_at, host, pid, thread)"
                " SELECT %s || 'lock:' || lpad(i::text, 7, '0'), md5(i::text), 1 + coalesce("
                "(SELECT fencing FROM django_distlock_lock WHERE name = %s), 0), now(),"
                " now() + interval '1 hour', 'bench-host', 4000 + i %% 100, 'MainThread'"
                " FROM generate_series(0, %s) AS i",
                [PREFIX, HIGH_WATER, count - 1],
            )
        with pg.connect() as conn:
            conn.execute("ANALYZE django_distlock_lock")

    def clear(self, backend: Any, count: int) -> None:
        from . import pg

        with pg.connect() as conn:
            conn.execute("DELETE FROM django_distlock_lock WHERE name LIKE %s", [PREFIX + "%"])
            conn.execute("VACUUM ANALYZE django_distlock_lock")


class ZkTarget(Target):
    """Container parents ``ROOT/<key>`` and ephemeral sequential contenders
    ``<guid>__lock__<seq>`` holding ``holder_data`` (``backends/zookeeper``), as async
    calls, 4,000 locks per session (closing a session deletes its nodes in one
    transaction: past about 2 MB of paths it breaks the ensemble, ZOOKEEPER-4306); a
    root per size (the emptied parents are reaped by the ensemble within a minute)."""

    alias, variable, largest = "scale-zk", "DISTLOCK_ZK_HOSTS", ZK_MAX
    why_largest = "2 znodes a lock; the shared ensemble's servers have 256 MB heaps"

    def __init__(self) -> None:
        self.root = f"{ZK_BASE}/{uuid.uuid4().hex[:8]}"
        self.sessions: list[Any] = []

    def entry(self) -> dict[str, Any]:
        return {"BACKEND": "django_distlock.backends.zookeeper.ZooKeeperBackend",
                "LOCATION": os.environ[self.variable], "KEY_PREFIX": PREFIX,
                "OPTIONS": {"ROOT": self.root}}

    def fill(self, backend: Any, count: int) -> None:
        from kazoo.client import KazooClient

        from django_distlock.backends.zookeeper.client import _CONTAINER, _OPEN, _CreateContainer

        every = list(names(count))
        for start in range(0, count, ZK_PER_SESSION):
            kazoo = KazooClient(hosts=os.environ[self.variable], timeout=30)
            kazoo.start(timeout=30)
            self.sessions.append(kazoo)
            kazoo.ensure_path(self.root)
            parents = [backend.parent_of(backend.make_key(n))
                       for n in every[start : start + ZK_PER_SESSION]]
            made = []
            for parent in parents:
                result = kazoo.handler.async_result()
                kazoo._call(_CreateContainer(parent, b"", _OPEN, _CONTAINER), result)
                made.append(result)
            for result in made:
                result.get(timeout=60)
            made = [
                kazoo.create_async(f"{parent}/{uuid.uuid4().hex}__lock__",
                                   f"1 exclusive {uuid.uuid4().hex[:8]} 4242 bench-host "
                                   "MainThread".encode(), ephemeral=True, sequence=True)
                for parent in parents
            ]
            for result in made:
                result.get(timeout=60)

    def read_all(self, backend: Any) -> Callable[[], Any] | None:
        return lambda: backend.client.call("listing the root", "get_children", self.root)

    def clear(self, backend: Any, count: int) -> None:
        from kazoo.client import KazooClient
        from kazoo.exceptions import NoNodeError, NotEmptyError

        for kazoo in self.sessions:  # their ephemeral contenders go with them
            kazoo.stop()
            kazoo.close()
        self.sessions = []
        # The emptied parents, deleted here: the ensemble reaps containers at 10,000 a
        # minute, a background load on the next benchmark's servers.
        kazoo = KazooClient(hosts=os.environ[self.variable], timeout=30)
        kazoo.start(timeout=30)
        try:
            every = list(names(count))
            for start in range(0, count, ZK_PER_SESSION):
                batch = every[start : start + ZK_PER_SESSION]
                sent = [kazoo.delete_async(backend.parent_of(backend.make_key(n)))
                        for n in batch]
                for result in sent:
                    with contextlib.suppress(NoNodeError, NotEmptyError):  # reaped; in use
                        result.get(timeout=60)
            kazoo.delete(self.root, recursive=True)
        finally:
            kazoo.stop()
            kazoo.close()
        self.root = f"{ZK_BASE}/{uuid.uuid4().hex[:8]}"


class MemcachedTarget(Target):
    alias, variable = "scale-memcached", "DISTLOCK_MEMCACHED"

    def entry(self) -> dict[str, Any]:
        return {"BACKEND": "django_distlock.backends.cache.CacheBackend",
                "OPTIONS": {"CACHE": "memcached"}, "KEY_PREFIX": PREFIX}


TARGETS: dict[str, Callable[[], Target]] = {
    "redis": RedisTarget, "redis-cluster": ClusterTarget, "pg.lease": PgTarget,
    "zk": ZkTarget, "memcached": MemcachedTarget,
}
