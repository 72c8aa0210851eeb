"""Redis cases: raw round trips, the peers a user would otherwise pick, and django-distlock.

All on the server of ``DISTLOCK_REDIS_URL``, each client with a connection pool
of its own (redis-py 8, its defaults). ``redis.ping`` is one round trip: the
unit the contended bars count handoffs in. ``redis.floor`` is the least a
lock with a safe release costs: ``SET key token NX PX`` then a compare-and-
delete ``EVALSHA``, sent raw (no ``Script`` object, no ``Lock`` object).
Every lock case builds a new lock object per acquisition, as user code does
(``with r.lock(key): ...``), with a 30 s lease and a 5 s acquire timeout:

- redis-py's ``Lock`` (``SET NX PX``; a release script) waits by polling every
  ``sleep`` seconds: 0.1 (its default) and 0.001;
- python-redis-lock's ``Lock`` (a ``GET`` to refuse a second acquire by the same
  object, ``SET NX EX``; waiters ``BLPOP`` a signal list that the release script
  pushes to);
- pottery's ``Redlock`` with one master (``SET NX PX``; waits by sleeping a
  random 0-200 ms);
- django-distlock: ``locks[alias].lock(key, ttl=30, timeout=5)`` on the alias
  ``redis`` (``LOCATION``: a pool of its own) and ``redis-cache`` (the pool of
  the django-redis cache ``CACHES["redis"]``), and contended on ``redis-unfair``
  (``FAIR: False``: no arrival order); see ``benchmarks/settings.py``.
"""

from __future__ import annotations

import functools
import os
import secrets
from importlib.metadata import version
from typing import Any
from urllib.parse import urlsplit

import redis
import redis_lock
from pottery import Redlock

from . import asyncio_contended, contention, lockers, uncontended
from .harness import Options, Ref, Row, Unavailable, add_bar, add_case

TTL, ACQUIRE_TIMEOUT = lockers.TTL, lockers.ACQUIRE_TIMEOUT
GROUP = "redis"
ALLOWED_HOSTS = ("127.0.0.1",)
#: Key patterns the peers' locks use for the benchmarks' names (``bench:...``).
PEER_KEYS = ("bench:*", "lock:bench:*", "lock-signal:bench:*", "redlock:bench:*")

# KEYS[1]: the lock; ARGV[1]: the token its holder set. Deletes it only if still theirs.
COMPARE_AND_DELETE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


# --------------------------------------------------------------------------- setup


def _url() -> str:
    return os.environ.get("DISTLOCK_REDIS_URL", "")


def connect() -> redis.Redis:
    """A redis-py client with a pool of its own on ``DISTLOCK_REDIS_URL``."""
    return redis.Redis.from_url(_url())


_django = lockers.django_setup


def setup() -> None:
    """Check the target and free the locks an interrupted run may have left held.

    :raises Unavailable: when no Redis is configured.
    :raises SystemExit: when the configured host is not 127.0.0.1.
    """
    if not _url():
        raise Unavailable(
            "DISTLOCK_REDIS_URL is not set: run scripts/bench, or export "
            "DISTLOCK_REDIS_URL=redis://127.0.0.1:PORT/0 for your own server"
        )
    host = urlsplit(_url()).hostname
    if host not in ALLOWED_HOSTS:
        raise SystemExit(f"benchmarks: refusing to target Redis on {host!r}: only 127.0.0.1")
    _django()
    from django_distlock import locks

    client = connect()
    try:
        for pattern in PEER_KEYS:
            for key in client.scan_iter(match=pattern, count=1000):
                client.delete(key)
    finally:
        client.close()
    backend = locks["redis"]  # "redis-cache" is the same server and key space
    cursor: str | None = None
    while True:
        page = backend.held_locks(prefix="bench:", limit=500, cursor=cursor)
        for info in page:
            backend.force_release(info.name)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    locks.close_all()


def describe() -> str:
    """The server's version and the clients' versions."""
    client = connect()
    try:
        server = client.info("server")["redis_version"]
    finally:
        client.close()
    peers = ", ".join(
        f"{name} {version(name)}" for name in ("python-redis-lock", "pottery", "django-redis")
    )
    return f"Redis {server}; redis-py {redis.__version__}; {peers}"


# --------------------------------------------------------------------------- lockers


class Ping:
    """(a) One ``PING`` round trip: the unit of the bars; release does nothing."""

    def __init__(self, key: str) -> None:
        self.client = connect()

    def acquire(self) -> bool:
        return bool(self.client.ping())

    def release(self) -> None:
        return None

    def close(self) -> None:
        self.client.close()


class Floor:
    """(b) ``SET key token NX PX`` with a fresh ``secrets.token_hex(16)``, then the
    compare-and-delete ``EVALSHA``: two round trips, nothing around them."""

    def __init__(self, key: str) -> None:
        self.client = connect()
        self.sha = self.client.script_load(COMPARE_AND_DELETE)
        self.key, self.ttl_ms, self.token = key, int(TTL * 1000), ""

    def acquire(self) -> bool:
        self.token = secrets.token_hex(16)
        return bool(self.client.set(self.key, self.token, nx=True, px=self.ttl_ms))

    def release(self) -> None:
        self.client.evalsha(self.sha, 1, self.key, self.token)

    def close(self) -> None:
        self.client.close()


class RedisPyLock:
    """(c) redis-py's ``Lock``: ``client.lock(key, timeout=30, sleep=..., blocking_timeout=5)``."""

    def __init__(self, key: str, *, sleep: float = 0.1) -> None:
        self.client, self.key, self.sleep = connect(), key, sleep
        self.lock: Any = None

    def acquire(self) -> bool:
        self.lock = self.client.lock(
            self.key, timeout=TTL, sleep=self.sleep, blocking_timeout=ACQUIRE_TIMEOUT
        )
        return bool(self.lock.acquire())

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.client.close()


class PythonRedisLock:
    """(d) python-redis-lock: ``redis_lock.Lock(client, key, expire=30)``,
    ``acquire(timeout=5)``."""

    def __init__(self, key: str) -> None:
        self.client, self.key = connect(), key
        self.lock: Any = None

    def acquire(self) -> bool:
        self.lock = redis_lock.Lock(self.client, self.key, expire=int(TTL))
        return bool(self.lock.acquire(timeout=int(ACQUIRE_TIMEOUT)))

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.client.close()


class PotteryRedlock:
    """(e) pottery's ``Redlock(key=key, masters={client}, auto_release_time=30)``,
    ``acquire(timeout=5)``: Redlock over one master."""

    def __init__(self, key: str) -> None:
        self.client, self.key = connect(), key
        self.lock: Any = None

    def acquire(self) -> bool:
        self.lock = Redlock(key=self.key, masters={self.client}, auto_release_time=TTL)
        return bool(self.lock.acquire(timeout=ACQUIRE_TIMEOUT))

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.client.close()


class DistLock(lockers.DistLock):
    """(f) django-distlock through its public API (:class:`benchmarks.lockers.DistLock`)."""


redis_py_1ms = functools.partial(RedisPyLock, sleep=0.001)
distlock = functools.partial(DistLock, alias="redis")
distlock_cache = functools.partial(DistLock, alias="redis-cache")
#: The ``asyncio`` suite's: tasks and threads alike wait up to its TASK_TIMEOUT.
distlock_tasks = functools.partial(DistLock, alias="redis", timeout=asyncio_contended.TASK_TIMEOUT)


def ideal_rate(ping_ns: float, row: Row, options: Options) -> float:
    """Grants per second if each cycle took the row's mean hold (the sleep as long as the
    OS made it) and two round trips (the release, then the grant to the next waiter)."""
    return 1e9 / (row.values["hold_mean"] + 2 * ping_ns)


# --------------------------------------------------------------------------- cases

_U, _C = uncontended.NAME, contention.NAME
#: The peers, in the uncontended and contended suites alike.
PEERS = (
    ("redis.redis-py", RedisPyLock, "redis-py `Lock`, `sleep=0.1` (default)"),
    ("redis.redis-py-1ms", redis_py_1ms, "redis-py `Lock`, `sleep=0.001`"),
    ("redis.python-redis-lock", PythonRedisLock, "python-redis-lock `Lock`"),
    ("redis.pottery", PotteryRedlock, "pottery `Redlock`, one master"),
)
DISTLOCK = (
    ("redis.distlock", distlock, "django-distlock, `LOCATION` (a pool of its own)"),
    ("redis.distlock-cache", distlock_cache, "django-distlock, `OPTIONS['CACHE']` (django-redis)"),
)
#: Uncontended only: what the queue's check and the listing index cost per pair.
LEAN = (
    (
        "redis.distlock-lean",
        functools.partial(DistLock, alias="redis-lean"),
        "django-distlock, `LOCATION`, `FAIR: False`, `LISTING: False`",
    ),
)
#: A handoff counted in round trips: the uncontended suite's PING, same run.
PING = Ref("redis.ping", suite=_U, metric="p50")

add_case(_U, "redis.ping", Ping, "(a) `PING`, one round trip", group=GROUP, reference="RTT")
add_case(
    _U,
    "redis.floor",
    Floor,
    "(b) `SET NX PX` + compare-and-delete `EVALSHA` (redis-py, raw)",
    group=GROUP,
    reference="floor",
)
for _name, _factory, _what in (*PEERS, *DISTLOCK, *LEAN):
    add_case(_U, _name, _factory, _what, group=GROUP)
for _name, _, _ in DISTLOCK:
    add_bar(_U, _name, "redis.floor", 1.05)
    add_bar(_U, _name, "redis.redis-py", 1.0)

for _name, _factory, _what in (*PEERS, *DISTLOCK):
    add_case(_C, _name, _factory, _what, group=GROUP)
add_case(
    _C,
    "redis.distlock-unfair",
    functools.partial(DistLock, alias="redis-unfair"),
    "django-distlock, `LOCATION`, `FAIR: False`",
    group=GROUP,
)
add_bar(_C, "redis.distlock", PING, 3.0)
add_bar(_C, "redis.distlock", PING, 8.0, metric="handoff_p99")
add_bar(
    _C,
    "redis.distlock",
    Ref(
        "redis.ping",
        suite=_U,
        metric="p50",
        derive=ideal_rate,
        label="1 / (hold mean + 2 x `redis.ping` uncontended p50)",
    ),
    0.9,
    metric="rate",
    at_least=True,
)
for _name, _, _ in PEERS:
    add_bar(_C, "redis.distlock", _name, 1.0, metric="rate", at_least=True)
add_bar(_C, "redis.distlock", None, 0.7, metric="fair_min", at_least=True)
add_bar(_C, "redis.distlock", None, 1.3, metric="fair_max")

asyncio_contended.add(
    "redis.distlock", distlock_tasks, "django-distlock, `LOCATION`", group=GROUP
)
