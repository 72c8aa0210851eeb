"""Redis behind Sentinel: what the Sentinel client and ``WAIT_REPLICAS`` cost.

On the Sentinel set of ``scripts/bench`` (a master, 2 replicas on loopback, 3
Sentinels; ``DISTLOCK_SENTINEL_URL``, and ``DISTLOCK_SENTINEL_MASTER_URL`` for the
master itself), django-distlock's acquire+release, a new handle per acquisition
(30 s lease, 5 s acquire timeout, as in :mod:`benchmarks.redis`):

- ``sentinel.plain``: alias ``sentinel-direct``, ``LOCATION`` the master's own URL
  (the plain Redis lock, on the same server as the two others);
- ``sentinel.distlock``: alias ``sentinel``, ``LOCATION`` the ``redis+sentinel://`` URL;
- ``sentinel.wait1``: alias ``sentinel-wait1``, the same with ``WAIT_REPLICAS = 1``
  (each grant waits until a replica acknowledged it: ``WAIT 1`` in the same send).

The printed ratios are each case over ``sentinel.plain`` (no bars: the cost of
``WAIT`` is the replicas' acknowledgement, which this machine's loopback makes small).
"""

from __future__ import annotations

import functools
import os
from urllib.parse import urlsplit

import redis

from . import lockers, uncontended
from .harness import Unavailable, add_bar, add_case
from .redis import ALLOWED_HOSTS

GROUP = "sentinel"
_U = uncontended.NAME


def _urls() -> tuple[str, str]:
    return (os.environ.get("DISTLOCK_SENTINEL_URL", ""),
            os.environ.get("DISTLOCK_SENTINEL_MASTER_URL", ""))


def setup() -> None:
    """Check the targets and free the locks an interrupted run may have left held.

    :raises Unavailable: when no Sentinel set is configured.
    :raises SystemExit: when a host is not 127.0.0.1.
    """
    sentinel, master = _urls()
    if not sentinel or not master:
        raise Unavailable(
            "DISTLOCK_SENTINEL_URL and DISTLOCK_SENTINEL_MASTER_URL are not set: run "
            "scripts/bench (scripts/servers.py starts the sentinel group)"
        )
    hosts = sentinel.split("://", 1)[1].split("/", 1)[0].split(",")
    for host in [h.rsplit(":", 1)[0] for h in hosts] + [urlsplit(master).hostname]:
        if host not in ALLOWED_HOSTS:
            raise SystemExit(f"benchmarks: refusing to target Redis on {host!r}: only 127.0.0.1")
    client = redis.Redis.from_url(master)
    try:
        for key in client.scan_iter(match="*bench:*", count=1000):
            client.delete(key)
    finally:
        client.close()
    lockers.django_setup()


def describe() -> str:
    """The master's version and its replicas."""
    client = redis.Redis.from_url(_urls()[1])
    try:
        server = client.info("server")["redis_version"]
        replicas = client.info("replication").get("connected_slaves", 0)
    finally:
        client.close()
    return f"Redis {server} behind 3 Sentinels, {replicas} replicas"


class DistLock(lockers.DistLock):
    """django-distlock through the Sentinel aliases (:class:`benchmarks.lockers.DistLock`)."""


CASES = (
    ("sentinel.plain", "sentinel-direct", "django-distlock, `LOCATION` the master's URL"),
    ("sentinel.distlock", "sentinel", "django-distlock, `redis+sentinel://` `LOCATION`"),
    ("sentinel.wait1", "sentinel-wait1", "django-distlock, Sentinel, `WAIT_REPLICAS = 1`"),
)
for _name, _alias, _what in CASES:
    add_case(_U, _name, functools.partial(DistLock, alias=_alias), _what, group=GROUP)
for _name in ("sentinel.distlock", "sentinel.wait1"):
    add_bar(_U, _name, "sentinel.plain", None)
add_bar(_U, "sentinel.wait1", "sentinel.distlock", None)
