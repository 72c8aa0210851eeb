"""Suite ``scale.handoff``: the peers' waiters (kazoo's ``Lock``, python-redis-lock), on
one client per process as an application would share it (see
:mod:`benchmarks.scale_handoff`)."""

from __future__ import annotations

import functools
import os
from typing import Any

from . import zookeeper
from .scale_handoff_waiters import WAIT


@functools.cache
def _shared(kind: str) -> Any:
    """One client per process for a peer's waiters (as an application would share it)."""
    if kind in zookeeper.TARGETS:
        return zookeeper._client(kind)
    import redis as redis_py  # 250 threads a process, each in BLPOP on a connection

    return redis_py.Redis.from_url(os.environ["DISTLOCK_REDIS_URL"], max_connections=300)


class KazooLock:
    """kazoo's ``Lock``, a new one per acquisition, on the process' one ``KazooClient``."""

    def __init__(self, key: str, *, target: str = "zk") -> None:
        self.client = _shared(target)
        self.path = f"{zookeeper.ROOT}/{key.replace('/', '_')}"
        self.lock: Any = None

    def acquire(self) -> bool:
        from kazoo.recipe.lock import Lock

        self.lock = Lock(self.client, self.path)
        return bool(self.lock.acquire(timeout=WAIT))

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        if self.client.connected:
            self.client.stop()
            self.client.close()


class PythonRedisLock:
    """python-redis-lock on the process' one client (waiters ``BLPOP`` a signal list)."""

    def __init__(self, key: str) -> None:
        self.client, self.key = _shared("redis"), key
        self.lock: Any = None

    def acquire(self) -> bool:
        import redis_lock

        self.lock = redis_lock.Lock(self.client, self.key, expire=int(WAIT))  # >= timeout
        return bool(self.lock.acquire(timeout=int(WAIT)))

    def release(self) -> None:
        assert self.lock is not None
        self.lock.release()

    def close(self) -> None:
        self.client.close()
