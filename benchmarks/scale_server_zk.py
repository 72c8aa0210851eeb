"""``scale.server.zookeeper``: packets and znodes per lock on ZooKeeper, from ``mntr``.

On the 3-node ensemble of ``DISTLOCK_ZK_HOSTS`` (``zk.*``) and the standalone server of
``DISTLOCK_ZK_STANDALONE`` (``zk1.*``), one started ``KazooClient`` per case:

- ``zk.kazoo``: kazoo's ``Lock(client, "/scale-kazoo/<name>")``, a new one per
  acquisition (reference ``kazoo``);
- ``zk.distlock``: ``locks["zk"]`` (``ROOT`` ``/distlock-bench-distlock``).

These rows take a quarter of ``--iterations`` (:data:`SHARE`): 500 pairs and 500 held locks
by default.

Read with the four-letter word ``mntr`` (``scripts/servers.py`` whitelists it) on every
server of the target: **recv/pair** and **sent/pair** are ``zk_packets_received`` and
``zk_packets_sent`` differenced around the pairs and summed over the servers (client
packets only: the ensemble's own traffic between servers is not in them; the session's
pings, one every few seconds, are); **znodes/held** and **data B/held** count the
nodes under the case's lock paths (``/scale-kazoo``, ``ROOT``'s ``scale:*`` parents) read
by a client, and their size as ``zk_approximate_data_size`` counts it (path length + data
length), while the locks are held; **znodes left/name** after their release: the lock
parents. Not ``zk_znode_count``: it is server-wide, and the server deletes other runs' empty
container nodes in the background (up to 10,000 a minute), which moves it under a
measure. The lock parents (kazoo's are persistent; django-distlock's are container nodes,
which the server deletes on its own within ``znode.container.checkIntervalMs``, 60 s by
default, so they are counted here).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

from . import lockers
from .harness import Case, Column, Unavailable
from .scale_server import (
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
)

PREFIX = "scale:"
KAZOO_ROOT = "/scale-kazoo"
DISTLOCK_ROOT = "/distlock-bench-distlock"  # the aliases' ROOT in benchmarks/settings.py
#: The rows take ``--iterations`` / SHARE pairs and held locks: each pair is two quorum
#: writes (3-5 ms), and the counts per pair are whole numbers from a few hundred on.
SHARE = 4
TARGETS = {"zk": "DISTLOCK_ZK_HOSTS", "zk1": "DISTLOCK_ZK_STANDALONE"}


def _hosts(target: str) -> str:
    return os.environ.get(TARGETS[target], "")


def _client(target: str) -> KazooClient:
    client = KazooClient(hosts=_hosts(target), timeout=10)
    client.start(timeout=30)
    return client


def setup() -> None:
    """Check the targets; remove the ``scale:`` nodes an interrupted run left.

    :raises Unavailable: when the ensemble or the standalone server is not configured.
    """
    for target, variable in TARGETS.items():
        if not _hosts(target):
            raise Unavailable(f"{variable} is not set: run scripts/bench, or export it")
        for host in _hosts(target).split(","):
            if host.rsplit(":", 1)[0] != "127.0.0.1":
                raise SystemExit(f"benchmarks: refusing to target ZooKeeper on {host!r}")
        _cleanup(target)
    lockers.django_setup()


def _cleanup(target: str) -> None:
    client = _client(target)
    try:
        client.delete(KAZOO_ROOT, recursive=True)
        if client.exists(DISTLOCK_ROOT):
            for child in client.get_children(DISTLOCK_ROOT):
                if child.startswith(PREFIX):
                    client.delete(f"{DISTLOCK_ROOT}/{child}", recursive=True)
    finally:
        client.stop()
        client.close()


def describe() -> str:
    """What the rows run on."""
    return "ZooKeeper ensemble and standalone (scale.server)"


def mntr(host: str) -> dict[str, str]:
    """The ``mntr`` answer of one server, by key."""
    address, port = host.rsplit(":", 1)
    with socket.create_connection((address, int(port)), timeout=5) as conn:
        conn.sendall(b"mntr")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    out = {}
    for line in data.decode().splitlines():
        key, _, value = line.partition("\t")
        out[key] = value
    return out


def _sum(target: str, key: str) -> int:
    return sum(int(mntr(host).get(key, 0)) for host in _hosts(target).split(","))


def subtree(client: KazooClient, root: str, prefix: str) -> tuple[int, int]:
    """The znodes under ``root`` whose first level starts with ``prefix`` (the lock
    parents and their contenders), and their size as ``zk_approximate_data_size`` counts
    it: each node's path length plus its data length."""
    nodes = size = 0
    if not client.exists(root):
        return 0, 0
    for parent in client.get_children(root):
        if not parent.startswith(prefix):
            continue
        path = f"{root}/{parent}"
        stat = client.exists(path)
        children = client.get_children(path) if stat else []
        for node in [path, *(f"{path}/{child}" for child in children)]:
            stat = client.exists(node)
            if stat is not None:
                nodes, size = nodes + 1, size + len(node) + stat.dataLength
    return nodes, size


# --------------------------------------------------------------------------- clients


class _KazooHandle:
    def __init__(self, client: KazooClient, path: str) -> None:
        self.lock = Lock(client, path)

    def acquire(self) -> bool:
        return bool(self.lock.acquire(timeout=5))

    def release(self) -> None:
        self.lock.release()


class Kazoo:
    """kazoo's ``Lock``, a new one per acquisition, on one started client."""

    def __init__(self, target: str) -> None:
        self.target, self.client = target, _client(target)

    def lock(self, name: str) -> Handle:
        return _KazooHandle(self.client, f"{KAZOO_ROOT}/{name}")

    def close(self) -> None:
        self.client.stop()
        self.client.close()


class DistLock(DistLockClient):
    """django-distlock (:class:`~benchmarks.scale_server.DistLockClient`) on ZooKeeper."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


def kazoo_ensemble() -> Kazoo:
    """kazoo on the ensemble."""
    return Kazoo("zk")


def kazoo_standalone() -> Kazoo:
    """kazoo on the standalone server."""
    return Kazoo("zk1")


def distlock_ensemble() -> DistLock:
    """``locks["zk"]``."""
    return DistLock("zk")


def distlock_standalone() -> DistLock:
    """``locks["zk1"]``."""
    return DistLock("zk1")


def measure(case: Case, count: int, settled: bool) -> dict[str, Any]:
    """The row of one case (see the module's docstring)."""
    count = max(count // SHARE, 2)
    client = client_of(case)
    target: str = client.target  # type: ignore[attr-defined]
    prefix = f"{PREFIX}{case.name}"
    root = KAZOO_ROOT if isinstance(client, Kazoo) else DISTLOCK_ROOT
    meter = _client(target)
    try:
        pairs(client, f"{prefix}:w0", 1)  # connected, scripts loaded; the rest below
        # held first: the lock parents the pairs leave are container nodes, which the
        # server deletes on its own, under the znode reads
        nodes0, size0 = subtree(meter, root, PREFIX)
        held = hold(client, f"{prefix}:h", count)
        try:
            nodes1, size1 = subtree(meter, root, PREFIX)
        finally:
            release_all(held)
        nodes2, _ = subtree(meter, root, PREFIX)
        pairs(client, f"{prefix}:w", WARMUP)
        recv0, sent0 = _sum(target, "zk_packets_received"), _sum(target, "zk_packets_sent")
        wall = pairs(client, f"{prefix}:p", count)
        recv1, sent1 = _sum(target, "zk_packets_received"), _sum(target, "zk_packets_sent")
    finally:
        client.close()
        meter.stop()
        meter.close()
        _cleanup(target)
    return {
        "recv": per(recv1 - recv0, count),
        "sent": per(sent1 - sent0, count),
        "wall_us": per(wall * 1e6, count),
        "znodes_held": per(nodes1 - nodes0, count),
        "data_held": per(size1 - size0, count),
        "znodes_left": per(nodes2 - nodes0, count),
    }


SUITE = register(
    "zookeeper",
    "Server cost per lock on ZooKeeper (`mntr`)",
    measure,
    (
        Column("recv", "packets recv/pair", fmt(2)),
        Column("sent", "packets sent/pair", fmt(2)),
        Column("wall_us", "wall µs/pair", fmt(1)),
        Column("znodes_held", "znodes/held lock", fmt(2)),
        Column("data_held", "data B/held lock", fmt(1)),
        Column("znodes_left", "znodes left/name", fmt(2)),
    ),
    "recv",
    "These rows: a quarter of those counts. Packets: `mntr` `zk_packets_received`/"
    "`zk_packets_sent` deltas summed over the "
    "target's servers; znodes and data: the nodes under the case's lock paths (path + "
    "data length, as `zk_approximate_data_size` counts). "
    "`x ref`: packets received over that row's.",
)
for _target, _where in (("zk", "ensemble"), ("zk1", "standalone")):
    _kazoo, _ours = (
        (kazoo_ensemble, distlock_ensemble) if _target == "zk"
        else (kazoo_standalone, distlock_standalone)
    )
    add(SUITE, f"{_target}.kazoo", _kazoo, f"kazoo `Lock`, {_where}", group=_where,
        reference="kazoo")
    add(SUITE, f"{_target}.distlock", _ours, f"django-distlock, {_where}", group=_where)
