"""ZooKeeper cases on the 3-node ensemble of ``DISTLOCK_ZK_HOSTS``.

``zk.exists`` is one ``exists()`` round trip (a read the connected server answers
alone: the floor). kazoo's ``Lock`` is used directly, a new ``Lock`` object per
acquisition on one started ``KazooClient`` per process (``acquire(timeout=5)``,
``release()``), as a user who writes kazoo by hand does; django-distlock's
``ZooKeeperBackend`` (alias ``zk``, ``benchmarks/settings.py``) through its public
API. Lock paths live under ``/distlock-bench``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

from . import contention, lockers, uncontended
from .harness import Unavailable, add_bar, add_case
from .lockers import ACQUIRE_TIMEOUT, django_setup

GROUP = "zookeeper"
ALLOWED_HOSTS = ("127.0.0.1",)
ROOT = "/distlock-bench"
#: The ``ROOT`` of the alias ``zk`` in ``benchmarks/settings.py``.
DISTLOCK_ROOT = "/distlock-bench-distlock"


def _hosts() -> str:
    return os.environ.get("DISTLOCK_ZK_HOSTS", "")


def _client() -> KazooClient:
    client = KazooClient(hosts=_hosts(), timeout=10)
    client.start(timeout=30)
    return client


def setup() -> None:
    """Check the targets and remove what an interrupted run left.

    :raises Unavailable: when no ensemble is configured.
    :raises SystemExit: when a host is not 127.0.0.1.
    """
    if not _hosts():
        raise Unavailable(
            "DISTLOCK_ZK_HOSTS is not set: run scripts/bench, or export "
            "DISTLOCK_ZK_HOSTS=127.0.0.1:PORT,..."
        )
    for host in _hosts().split(","):
        if host.rsplit(":", 1)[0] not in ALLOWED_HOSTS:
            raise SystemExit(f"benchmarks: refusing to target ZooKeeper on {host!r}")
    client = _client()
    try:
        for root in (ROOT, DISTLOCK_ROOT):
            client.delete(root, recursive=True)
    finally:
        client.stop()
        client.close()
    django_setup()


def describe() -> str:
    """The server's and kazoo's versions."""
    from importlib.metadata import version

    client = _client()
    try:
        first = client.command(b"srvr").splitlines()[0]  # "Zookeeper version: 3.8.0-..."
        server = first.split(":", 1)[1].strip().split("-")[0]
    finally:
        client.stop()
        client.close()
    return f"ZooKeeper {server} (3-node ensemble); kazoo {version('kazoo')}"


class Exists:
    """(a) One ``exists()`` round trip; release does nothing."""

    def __init__(self, key: str) -> None:
        self.client = _client()

    def acquire(self) -> bool:
        self.client.exists("/")
        return True

    def release(self) -> None:
        return None

    def close(self) -> None:
        self.client.stop()
        self.client.close()


class KazooLock:
    """(b) kazoo's ``Lock(client, path)``, a new one per acquisition."""

    def __init__(self, key: str) -> None:
        self.client = _client()
        self.path = f"{ROOT}/{key.replace('/', '_')}"
        self.lock: Any = None

    def acquire(self) -> bool:
        self.lock = Lock(self.client, self.path)
        return bool(self.lock.acquire(timeout=ACQUIRE_TIMEOUT))

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.client.stop()
        self.client.close()


class DistLock(lockers.DistLock):
    """(c) django-distlock's ``ZooKeeperBackend`` (:class:`benchmarks.lockers.DistLock`)."""


_U, _C = uncontended.NAME, contention.NAME
add_case(_U, "zk.exists", Exists, "(a) `exists()`, one round trip", group=GROUP, reference="RTT")
add_case(_U, "zk.kazoo", KazooLock, "(b) kazoo `Lock`", group=GROUP, reference="kazoo")
for _suite in (_U, _C):
    if _suite == _C:
        add_case(_C, "zk.kazoo", KazooLock, "kazoo `Lock`", group=GROUP)
    add_case(
        _suite,
        "zk.distlock",
        functools.partial(DistLock, alias="zk"),
        "django-distlock `ZooKeeperBackend`",
        group=GROUP,
    )
add_bar(_U, "zk.distlock", "zk.kazoo", 1.0)
add_bar(_C, "zk.distlock", "zk.kazoo", 1.0)
add_bar(_C, "zk.distlock", "zk.kazoo", 1.0, metric="rate", at_least=True)
add_bar(_C, "zk.distlock", None, 0.7, metric="fair_min", at_least=True)
add_bar(_C, "zk.distlock", None, 1.3, metric="fair_max")
