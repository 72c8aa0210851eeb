"""``scale.server.redis``: server time and memory per lock on Redis, from ``INFO``.

Rows on the server of ``DISTLOCK_REDIS_URL`` (``redis.*``) and per master of the
Redlock masters of ``DISTLOCK_REDLOCK_URLS`` (``redlock.*``: every figure summed over the
masters and divided by their number). A new lock object per acquisition, 30 s lease:

- ``redis.floor``: ``SET name token NX PX`` then ``DEL name``, raw (reference ``floor``);
- ``redis.redis-py``: redis-py's ``Lock`` (``SET NX PX``, a compare-and-delete script;
  reference ``redis-py``); ``redis.python-redis-lock``; ``redis.pottery`` (one master);
- ``redis.distlock``: ``locks["redis"]`` (``benchmarks/settings.py``), and
  ``redis.distlock-lean``: ``locks["redis-lean"]`` (``FAIR`` and ``LISTING`` off);
- ``redlock.pottery`` and ``redlock.distlock`` (``locks["redlock"]``), 5 masters.

**Server µs per pair** is the ``usec`` of ``INFO commandstats``, differenced around the
pairs, summed over the commands the *client* sent (top-level) only. A script's
``EVALSHA``/``FCALL`` time already includes the commands it runs, which Redis counts
again under their own names. Method: after the memory figures and the counted pairs,
``MONITOR`` watches 10 more pairs of the same client on the first server; it tells each
command sent by a client (``[db addr]``) from one run inside a script (``[db lua]``).
Each command name's ``usec`` delta is then counted in the proportion of its calls that
were top-level in the watched pairs (1 or 0 unless the same name is both sent and run by
a script; a name not seen there counts as top-level; ``INFO`` itself is left out).
**cmds/pair**: top-level commands per pair; **in scripts/pair**: commands scripts ran,
**their µs/pair** their own ``usec`` (inside the scripts' time: the rest of a script's
time is the Lua call around them); the last column spells both out by name, as
``MONITOR`` saw them (first server).

**Memory**: ``used_memory`` (read until 5 reads 0.1 s apart lie within 256 B,
:func:`~benchmarks.scale_server.settle`) before, while the locks are held, and after
their release; ``DBSIZE`` likewise. The difference includes the growth of Redis's key
tables (power-of-two rehashes), so a figure moves by a few bytes with the number of
locks.
"""

from __future__ import annotations

import functools
import secrets
import threading
from collections import Counter
from typing import Any

import redis
import redis_lock
from pottery import Redlock

from . import lockers
from .harness import Case, Column, Row, Unavailable, add_bar
from .scale_server import (
    READS,
    WARMUP,
    DistLockClient,
    Handle,
    add,
    client_of,
    fmt,
    hold,
    pairs,
    per,
    ratio_column,
    register,
    release_all,
    settle,
)

TTL = lockers.TTL
PREFIX = "scale:"
#: Pairs watched by ``MONITOR`` to tell top-level commands from a script's.
WATCHED = 10
_URL_VARS = ("DISTLOCK_REDIS_URL", "DISTLOCK_REDLOCK_URLS")


def _urls(variable: str) -> list[str]:
    import os

    return [url for url in os.environ.get(variable, "").split(",") if url]


def setup() -> None:
    """Check the targets; free what an interrupted run left (``scale:`` names).

    :raises Unavailable: when Redis or the Redlock masters are not configured.
    """
    from urllib.parse import urlsplit

    for variable in _URL_VARS:
        if not _urls(variable):
            raise Unavailable(f"{variable} is not set: run scripts/bench, or export it")
        for url in _urls(variable):
            if urlsplit(url).hostname != "127.0.0.1":
                raise SystemExit(f"benchmarks: refusing to target Redis at {url}: only 127.0.0.1")
    lockers.django_setup()
    _cleanup()


def _cleanup() -> None:
    from django_distlock import locks

    backend = locks["redis"]  # Redlock cannot list: its keys go by name below
    cursor: str | None = None
    while True:
        page = backend.held_locks(prefix=PREFIX, limit=500, cursor=cursor)
        for info in page:
            backend.force_release(info.name)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    locks.close_all()
    for url in _urls("DISTLOCK_REDIS_URL") + _urls("DISTLOCK_REDLOCK_URLS"):
        conn = redis.Redis.from_url(url)
        try:
            for key in conn.scan_iter(match=f"*{PREFIX}*", count=1000):
                # what force_release left: Redlock's keys, and the unlisted alias'
                conn.delete(key)
        finally:
            conn.close()


def describe() -> str:
    """The server's version."""
    conn = redis.Redis.from_url(_urls("DISTLOCK_REDIS_URL")[0])
    try:
        return f"Redis {conn.info('server')['redis_version']} (scale.server)"
    finally:
        conn.close()


# --------------------------------------------------------------------------- clients


class _Client:
    """A redis-py client (a pool of its own) per server; ``make(name)`` builds a handle."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.conns = [redis.Redis.from_url(url) for url in urls]

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


class _SetDel:
    def __init__(self, conn: redis.Redis, name: str) -> None:
        self.conn, self.name = conn, name

    def acquire(self) -> bool:
        return bool(self.conn.set(self.name, secrets.token_hex(16), nx=True, px=int(TTL * 1000)))

    def release(self) -> None:
        self.conn.delete(self.name)


class Floor(_Client):
    """``SET name token NX PX`` + ``DEL name``: the least a lock sends (no safe release)."""

    def __init__(self) -> None:
        super().__init__(_urls("DISTLOCK_REDIS_URL"))

    def lock(self, name: str) -> Handle:
        return _SetDel(self.conns[0], name)


class _Call:
    """A peer's lock object with its acquire call's arguments bound."""

    def __init__(self, lock: Any, **kwargs: Any) -> None:
        self.lock_, self.kwargs = lock, kwargs

    def acquire(self) -> bool:
        return bool(self.lock_.acquire(**self.kwargs))

    def release(self) -> None:
        self.lock_.release()


class RedisPy(_Client):
    """redis-py's ``Lock``: ``conn.lock(name, timeout=30, blocking_timeout=5)``."""

    def __init__(self) -> None:
        super().__init__(_urls("DISTLOCK_REDIS_URL"))

    def lock(self, name: str) -> Handle:
        return _Call(self.conns[0].lock(name, timeout=TTL, blocking_timeout=5))


class PythonRedisLock(_Client):
    """python-redis-lock: ``redis_lock.Lock(conn, name, expire=30)``."""

    def __init__(self) -> None:
        super().__init__(_urls("DISTLOCK_REDIS_URL"))

    def lock(self, name: str) -> Handle:
        return _Call(redis_lock.Lock(self.conns[0], name, expire=int(TTL)), timeout=5)


class Pottery(_Client):
    """pottery's ``Redlock(key=name, masters=..., auto_release_time=30)``."""

    def __init__(self, variable: str) -> None:
        super().__init__(_urls(variable))
        self.masters = set(self.conns)

    def lock(self, name: str) -> Handle:
        lock = Redlock(key=name, masters=self.masters, auto_release_time=TTL)
        return _Call(lock, timeout=5)


class DistLock(DistLockClient):
    """django-distlock (:class:`~benchmarks.scale_server.DistLockClient`) on Redis."""

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        variable = "DISTLOCK_REDLOCK_URLS" if alias == "redlock" else "DISTLOCK_REDIS_URL"
        self.urls = _urls(variable)


pottery_one = functools.partial(Pottery, "DISTLOCK_REDIS_URL")
pottery_five = functools.partial(Pottery, "DISTLOCK_REDLOCK_URLS")
distlock = functools.partial(DistLock, "redis")
distlock_redlock = functools.partial(DistLock, "redlock")
distlock_lean = functools.partial(DistLock, "redis-lean")


# --------------------------------------------------------------------------- accounting


def _base(name: str) -> str:
    """``cmdstat_client|setinfo`` -> ``client``."""
    return name.removeprefix("cmdstat_").split("|", 1)[0].lower()


def _stats(conns: list[redis.Redis]) -> Counter[tuple[str, str]]:
    """(command, ``calls``/``usec``) -> summed over the servers."""
    total: Counter[tuple[str, str]] = Counter()
    for conn in conns:
        for name, stat in conn.info("commandstats").items():
            total[(_base(name), "calls")] += int(stat["calls"])
            total[(_base(name), "usec")] += int(stat["usec"])
    return total


def watch(client: Any, url: str, prefix: str) -> tuple[Counter[str], Counter[str]]:
    """``MONITOR`` the server of ``url`` while ``client`` runs :data:`WATCHED` pairs; return
    the commands sent by clients and those run inside scripts, by name."""
    sent: Counter[str] = Counter()
    scripted: Counter[str] = Counter()
    marker = f"{prefix}:monitor-end:{secrets.token_hex(4)}"
    conn, poke = redis.Redis.from_url(url), redis.Redis.from_url(url)
    poke.ping()  # connected before MONITOR starts: its HELLO is not among the pairs'
    try:
        with conn.monitor() as monitor:

            def end() -> None:
                pairs(client, prefix, WATCHED)
                poke.echo(marker)

            worker = threading.Thread(target=end)
            worker.start()
            while True:
                command = monitor.next_command()
                name = command["command"].split(" ", 1)[0].lower()
                if name == "echo" and marker in command["command"]:
                    break
                (scripted if command["client_type"] == "lua" else sent)[name] += 1
            worker.join()
    finally:
        conn.close()
        poke.close()
    return sent, scripted


def measure(case: Case, count: int, settled: bool) -> dict[str, float]:
    """The row of one case (see the module's docstring)."""
    client = client_of(case)
    urls: list[str] = client.urls  # type: ignore[attr-defined]
    meters = [redis.Redis.from_url(url) for url in urls]
    prefix = f"{PREFIX}{case.name}"
    servers = len(urls)
    try:
        pairs(client, f"{prefix}:w0", 1)  # connected, scripts loaded; the rest below
        # held first: what the pairs leave (python-redis-lock's signal lists, 1 s) would
        # expire under the memory reads
        reads = READS if settled else 0
        memory = lambda: float(sum(int(m.info("memory")["used_memory"]) for m in meters))  # noqa: E731
        keys = lambda: float(sum(int(m.dbsize()) for m in meters))  # noqa: E731
        mem0, keys0 = settle(memory, reads), keys()
        held = hold(client, f"{prefix}:h", count)
        try:
            mem1, keys1 = settle(memory, reads), keys()
        finally:
            release_all(held)
        mem2, keys2 = settle(memory, reads), keys()
        pairs(client, f"{prefix}:w", WARMUP)
        before = _stats(meters)
        wall = pairs(client, f"{prefix}:p", count)
        after = _stats(meters)
        # last: a MONITOR client's buffers would show in used_memory
        sent, scripted = watch(client, urls[0], f"{prefix}:m")
        usec = calls = inner = inner_usec = 0.0
        for (name, field), value in after.items():
            delta = value - before.get((name, field), 0)
            if name == "info" or not delta:
                continue
            seen = sent[name] + scripted[name]
            top = sent[name] / seen if seen else 1.0
            if field == "usec":
                usec += delta * top
                inner_usec += delta * (1 - top)
            else:
                calls += delta * top
                inner += delta * (1 - top)
    finally:
        client.close()
        for meter in meters:
            meter.close()
        _cleanup()
    per_pair = count * servers
    return {
        "server_us": per(usec, per_pair),
        "wall_us": per(wall * 1e6, count),
        "calls": per(calls, per_pair),
        "inner_us": per(inner_usec, per_pair),
        "inner": per(inner, per_pair),
        "mem_held": per(mem1 - mem0, count * servers),
        "keys_held": per(keys1 - keys0, count * servers),
        "mem_left": per(mem2 - mem0, count * servers),
        "keys_left": per(keys2 - keys0, count * servers),
        "commands": _spell(sent, scripted),
    }


def _spell(sent: Counter[str], scripted: Counter[str]) -> str:
    """``evalsha 2 (get 2, time 2, ...)``: the watched commands per pair, by name."""

    def names(counts: Counter[str]) -> str:
        return ", ".join(f"{name} {n / WATCHED:g}" for name, n in counts.most_common())

    inner = names(scripted)
    return names(sent) + (f" ({inner})" if inner else "")


def _finish(rows: list[Row]) -> None:
    ratio_column(rows, "mem_held", "redis.redis-py", "mem_x_redis_py")


SUITE = register(
    "redis",
    "Server cost per lock on Redis (`INFO commandstats`, `used_memory`)",
    measure,
    (
        Column("server_us", "server µs/pair", fmt(2)),
        Column("calls", "cmds/pair", fmt(2)),
        Column("inner", "in scripts/pair", fmt(2)),
        Column("inner_us", "their µs/pair", fmt(2)),
        Column("wall_us", "wall µs/pair", fmt(1)),
        Column("mem_held", "B/held lock", fmt(0)),
        Column("mem_x_redis_py", "B/held x redis-py", fmt(2)),
        Column("keys_held", "keys/held lock", fmt(2)),
        Column("mem_left", "B left/name", fmt(1)),
        Column("keys_left", "keys left/name", fmt(3)),
        Column("commands", "per pair: sent (in scripts), by `MONITOR`"),
    ),
    "server_us",
    "Server µs: `INFO commandstats` usec of the top-level commands only (`MONITOR` tells "
    "them from a script's, see `benchmarks/scale_server_redis.py`); `redlock.*` per master. "
    "B: `used_memory` deltas (once it holds still). `x ref`: server µs over that row's.",
    _finish,
)
_G = "redis"
add(SUITE, "redis.floor", Floor, "`SET NX PX` + `DEL`, raw", group=_G, reference="floor")
add(SUITE, "redis.redis-py", RedisPy, "redis-py `Lock`", group=_G, reference="redis-py Lock")
add(SUITE, "redis.python-redis-lock", PythonRedisLock, "python-redis-lock `Lock`", group=_G)
add(SUITE, "redis.pottery", pottery_one, "pottery `Redlock`, one master", group=_G)
add(SUITE, "redis.distlock", distlock, "django-distlock `RedisBackend`", group=_G)
add(SUITE, "redis.distlock-lean", distlock_lean,
    "django-distlock `RedisBackend`, `FAIR` and `LISTING` off", group=_G)
add(SUITE, "redlock.pottery", pottery_five, "pottery `Redlock`, 5 masters, per master",
    group=_G)
add(SUITE, "redlock.distlock", distlock_redlock,
    "django-distlock `RedlockBackend`, 5 masters, per master", group=_G)
add_bar(SUITE, "redis.distlock", "redis.redis-py", 1.0)
add_bar(SUITE, "redis.distlock", "redis.floor", 2.0)  # the moonshot
add_bar(SUITE, "redis.distlock", "redis.redis-py", 1.5, metric="mem_held")
add_bar(SUITE, "redlock.distlock", "redlock.pottery", None)
add_bar(SUITE, "redis.distlock-lean", "redis.redis-py", 1.0)
add_bar(SUITE, "redis.distlock-lean", "redis.redis-py", 1.5, metric="mem_held")
