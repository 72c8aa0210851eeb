"""``scale.server.memcached``: commands and bytes per lock on memcached, from ``stats``.

On the server of ``DISTLOCK_MEMCACHED``:

- ``cache.floor``: pymemcache ``add(name, token, expire=30)`` + ``delete(name)``, raw
  (reference ``floor``; no owner check on release, so a floor, not a safe lock);
- ``cache.distlock``: ``locks["cache-memcached"]`` (``CacheBackend`` on a
  ``PyMemcacheCache``; its keys carry the cache's key prefix and version).

**cmds/pair**: the ``stats`` counters of requests differenced around the pairs
(``cmd_get`` + ``cmd_set`` + ``cmd_touch`` + ``delete_hits`` + ``delete_misses``; the meta
commands ``mg``/``ms``/``md`` count under the same), and each apart;
**B/held lock**: ``bytes`` (item memory, keys and values) while the locks are held,
**items/held lock**: ``curr_items``; **items left/name** after their release.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from pymemcache.client.base import Client as Memcache

from . import lockers
from .harness import Case, Column, Unavailable
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
    register,
    release_all,
    settle,
)

PREFIX = "scale:"
COUNTERS = ("cmd_get", "cmd_set", "cmd_touch", "delete_hits", "delete_misses")


def _server() -> tuple[str, int]:
    host, _, port = os.environ.get("DISTLOCK_MEMCACHED", "").rpartition(":")
    return host, int(port or 0)


def setup() -> None:
    """Check the target (a run's keys expire after 30 s; nothing to clean).

    :raises Unavailable: when no memcached is configured.
    """
    if not os.environ.get("DISTLOCK_MEMCACHED"):
        raise Unavailable("DISTLOCK_MEMCACHED is not set: run scripts/bench, or export it")
    if _server()[0] != "127.0.0.1":
        raise SystemExit("benchmarks: refusing to target memcached off 127.0.0.1")
    lockers.django_setup()


def describe() -> str:
    """What the rows run on."""
    return "memcached (scale.server)"


def _stats() -> dict[str, int]:
    conn = Memcache(_server())
    try:
        stats = conn.stats()
    finally:
        conn.close()
    return {key.decode(): int(value) for key, value in stats.items()
            if isinstance(value, int) and not isinstance(value, bool)}


class _AddDelete:
    def __init__(self, conn: Memcache, name: str) -> None:
        self.conn, self.name = conn, name

    def acquire(self) -> bool:
        return bool(self.conn.add(self.name, secrets.token_hex(16), expire=int(lockers.TTL),
                                  noreply=False))

    def release(self) -> None:
        self.conn.delete(self.name, noreply=False)


class Floor:
    """pymemcache ``add`` + ``delete`` on one connection."""

    def __init__(self) -> None:
        self.conn = Memcache(_server())

    def lock(self, name: str) -> Handle:
        return _AddDelete(self.conn, name)

    def close(self) -> None:
        self.conn.close()


def distlock() -> DistLockClient:
    """django-distlock: ``locks["cache-memcached"]``."""
    return DistLockClient("cache-memcached")


def measure(case: Case, count: int, settled: bool) -> dict[str, Any]:
    """The row of one case (see the module's docstring)."""
    client = client_of(case)
    prefix = f"{PREFIX}{case.name}:{secrets.token_hex(3)}"  # expired keys of a run before
    reads = READS if settled else 0
    try:
        pairs(client, f"{prefix}:w", WARMUP)
        before = _stats()
        wall = pairs(client, f"{prefix}:p", count)
        after = _stats()
        delta = {key: after.get(key, 0) - before.get(key, 0) for key in COUNTERS}
        memory = lambda: float(_stats()["bytes"])  # noqa: E731
        items = lambda: float(_stats()["curr_items"])  # noqa: E731
        bytes0, items0 = settle(memory, reads), items()
        held = hold(client, f"{prefix}:h", count)
        try:
            bytes1, items1 = settle(memory, reads), items()
        finally:
            release_all(held)
        items2 = items()
    finally:
        client.close()
    row = {
        "cmds": per(sum(delta.values()), count),
        "wall_us": per(wall * 1e6, count),
        "bytes_held": per(bytes1 - bytes0, count),
        "items_held": per(items1 - items0, count),
        "items_left": per(items2 - items0, count),
    }
    row["split"] = ", ".join(f"{k} {per(v, count):.2f}" for k, v in delta.items() if v)
    return row


SUITE = register(
    "memcached",
    "Server cost per lock on memcached (`stats`)",
    measure,
    (
        Column("cmds", "cmds/pair", fmt(2)),
        Column("split", "per pair"),
        Column("wall_us", "wall µs/pair", fmt(1)),
        Column("bytes_held", "B/held lock", fmt(0)),
        Column("items_held", "items/held lock", fmt(2)),
        Column("items_left", "items left/name", fmt(2)),
    ),
    "cmds",
    "Commands: `stats` deltas (`cmd_get`, `cmd_set`, `cmd_touch`, `delete_hits`, "
    "`delete_misses`); B: `bytes`. `x ref`: commands over that row's.",
)
add(SUITE, "cache.floor", Floor, "pymemcache `add` + `delete`, raw", group="memcached",
    reference="floor")
add(SUITE, "cache.distlock", distlock, "django-distlock `CacheBackend`", group="memcached")
