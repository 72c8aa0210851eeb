"""ZooKeeper cases on the 3-node ensemble of ``DISTLOCK_ZK_HOSTS`` (``zk.*``) and on the
standalone server of ``DISTLOCK_ZK_STANDALONE`` (``zk1.*``: no quorum behind a write).

``zk.exists`` is one ``exists()`` round trip (a read the connected server answers
alone: the floor). kazoo's ``Lock`` is used directly, a new ``Lock`` object per
acquisition on one started ``KazooClient`` per process (``acquire(timeout=5)``,
``release()``), as a user who writes kazoo by hand does; django-distlock's
``ZooKeeperBackend`` (alias ``zk``, ``benchmarks/settings.py``) through its public
API (aliases ``zk`` and ``zk1``). Lock paths live under ``/distlock-bench``.

The semaphore rows (``*.sem-*``, uncontended) put django-distlock's
``semaphore(name, 4)`` next to kazoo's ``Semaphore(client, path, max_leases=4)``,
a new one per acquisition as for the lock; ``x kazoo Semaphore`` divides by
kazoo's row on the same server.

``python -m benchmarks.zookeeper [--processes 8] [--duration 3] [--target zk1]`` is not a
suite: it counts what one contended grant costs (the ``contended`` suite's loop, kazoo's
``Lock`` and django-distlock in turn): the requests each client sent, by type (kazoo's
``_call`` counted in every process), and the server's ``zk_packets_received`` and
``zk_packets_sent`` (``mntr``; requests, and replies plus watch events) per grant.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock, Semaphore

from . import asyncio_contended, contention, lockers, uncontended
from .harness import Unavailable, add_bar, add_case
from .lockers import ACQUIRE_TIMEOUT, django_setup

GROUP = "zookeeper"
ALLOWED_HOSTS = ("127.0.0.1",)
ROOT = "/distlock-bench"
#: The ``ROOT`` of the alias ``zk`` in ``benchmarks/settings.py``.
DISTLOCK_ROOT = "/distlock-bench-distlock"
#: Permits of the semaphore rows.
LIMIT = 4


#: The environment variable naming the servers of each target.
TARGETS = {"zk": "DISTLOCK_ZK_HOSTS", "zk1": "DISTLOCK_ZK_STANDALONE"}


def _hosts(target: str = "zk") -> str:
    return os.environ.get(TARGETS[target], "")


def _client(target: str = "zk") -> KazooClient:
    client = KazooClient(hosts=_hosts(target), timeout=10)
    client.start(timeout=30)
    return client


def setup() -> None:
    """Check the targets and remove what an interrupted run left.

    :raises Unavailable: when no ensemble is configured.
    :raises SystemExit: when a host is not 127.0.0.1.
    """
    for target, variable in TARGETS.items():
        if not _hosts(target):
            raise Unavailable(
                f"{variable} is not set: run scripts/bench (it starts the ensemble and a "
                "standalone ZooKeeper), or export both DISTLOCK_ZK_HOSTS and "
                "DISTLOCK_ZK_STANDALONE"
            )
        for host in _hosts(target).split(","):
            if host.rsplit(":", 1)[0] not in ALLOWED_HOSTS:
                raise SystemExit(f"benchmarks: refusing to target ZooKeeper on {host!r}")
        client = _client(target)
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
    return f"ZooKeeper {server} (3-node ensemble, and standalone); kazoo {version('kazoo')}"


class Exists:
    """(a) One ``exists()`` round trip; release does nothing."""

    def __init__(self, key: str, *, target: str = "zk") -> None:
        self.client = _client(target)

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

    def __init__(self, key: str, *, target: str = "zk") -> None:
        self.client = _client(target)
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


class KazooSemaphore(KazooLock):
    """kazoo's ``Semaphore(client, path, max_leases=LIMIT)``, a new one per acquisition."""

    def acquire(self) -> bool:
        self.lock = Semaphore(self.client, self.path, max_leases=LIMIT)
        return bool(self.lock.acquire(timeout=ACQUIRE_TIMEOUT))


class DistSemaphore(lockers.DistLock):
    """django-distlock's ``semaphore(name, LIMIT)``, a new handle per acquisition."""

    def _handle(self) -> Any:
        return self.locks[self.alias].semaphore(
            self.key, LIMIT, ttl=lockers.TTL, timeout=self.timeout
        )


_U, _C = uncontended.NAME, contention.NAME
for _target, _where in (("zk", "ensemble"), ("zk1", "standalone")):
    _exists = functools.partial(Exists, target=_target)
    _kazoo = functools.partial(KazooLock, target=_target)
    _ours = functools.partial(DistLock, alias=_target)
    add_case(_U, f"{_target}.exists", _exists, f"(a) `exists()`, {_where}", group=GROUP)
    add_case(_U, f"{_target}.kazoo", _kazoo, f"(b) kazoo `Lock`, {_where}", group=GROUP)
    add_case(_U, f"{_target}.distlock", _ours, f"(c) django-distlock, {_where}", group=GROUP)
    add_case(_C, f"{_target}.kazoo", _kazoo, f"kazoo `Lock`, {_where}", group=GROUP)
    add_case(_C, f"{_target}.distlock", _ours, f"django-distlock, {_where}", group=GROUP)
    add_bar(_U, f"{_target}.distlock", f"{_target}.kazoo", 1.0)
    add_bar(_C, f"{_target}.distlock", f"{_target}.kazoo", 1.0)
    add_bar(_C, f"{_target}.distlock", f"{_target}.kazoo", 1.0, metric="rate", at_least=True)
    add_bar(_C, f"{_target}.distlock", None, 0.7, metric="fair_min", at_least=True)
    add_bar(_C, f"{_target}.distlock", None, 1.3, metric="fair_max")
    _sem = f"zookeeper semaphore, {_where}"  # a group of its own: its ``x kazoo`` column
    add_case(
        _U, f"{_target}.sem-kazoo", functools.partial(KazooSemaphore, target=_target),
        f"kazoo `Semaphore(max_leases={LIMIT})`, {_where}", group=_sem,
        reference="kazoo Semaphore",
    )
    add_case(
        _U, f"{_target}.sem-distlock", functools.partial(DistSemaphore, alias=_target),
        f"django-distlock `semaphore(name, {LIMIT})`, {_where}", group=_sem,
    )
    add_bar(_U, f"{_target}.sem-distlock", f"{_target}.sem-kazoo", 1.0)
    for _name, _cls, _who in (("sem-kazoo", KazooSemaphore, "kazoo `Semaphore`"),
                              ("sem-distlock", DistSemaphore, "django-distlock `semaphore`")):
        _arg = {"target": _target} if _cls is KazooSemaphore else {"alias": _target}
        add_case(
            _C, f"{_target}.{_name}", functools.partial(_cls, **_arg),
            f"{_who}, {LIMIT} permits, {_where}", group=_sem, at_once=LIMIT,
        )
    add_bar(_C, f"{_target}.sem-distlock", f"{_target}.sem-kazoo", 1.0, metric="rate",
            at_least=True)
asyncio_contended.add("zk.distlock", functools.partial(
    DistLock, alias="zk", timeout=asyncio_contended.TASK_TIMEOUT
), "django-distlock, ensemble", group=GROUP)




# -- requests per grant (``python -m benchmarks.zookeeper``) ----------------------------


def _mntr(target: str) -> dict[str, int]:
    client = _client(target)
    try:
        text = client.command(b"mntr")
    finally:
        client.stop()
        client.close()
    pairs = (line.split("\t", 1) for line in text.splitlines() if "\t" in line)
    return {key: int(value) for key, value in pairs if value.isdigit()}


def _counting_worker(
    factory: Any, key: str, seconds: float, hold: float, barrier: Any, results: Any
) -> None:
    """Acquire, sleep ``hold``, release, for ``seconds``; count the requests sent."""
    locker = factory(key)
    if locker.acquire():  # connect before counting
        locker.release()
    counts: dict[str, int] = {}
    real = KazooClient._call

    def call(client: KazooClient, request: Any, result: Any) -> Any:
        name = type(request).__name__
        counts[name] = counts.get(name, 0) + 1
        return real(client, request, result)

    KazooClient._call = call  # type: ignore[method-assign]  # this worker process only
    barrier.wait(60)
    grants, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        if locker.acquire():
            time.sleep(hold)
            locker.release()
            grants += 1
    KazooClient._call = real  # type: ignore[method-assign]
    results.put((grants, counts))
    locker.close()


def requests_per_grant(target: str, processes: int, seconds: float) -> None:
    """Print, for kazoo's ``Lock`` and django-distlock on ``target``, the requests sent
    and the server's packets per grant (``processes`` contending for ``seconds``)."""
    ctx = multiprocessing.get_context("spawn")
    for name, factory in (
        ("kazoo", functools.partial(KazooLock, target=target)),
        ("distlock", functools.partial(DistLock, alias=target)),
    ):
        barrier, results = ctx.Barrier(processes + 1), ctx.Queue()
        args = (factory, f"bench:requests:{name}", seconds, 0.001, barrier, results)
        workers = [ctx.Process(target=_counting_worker, args=args) for _ in range(processes)]
        for worker in workers:
            worker.start()
        barrier.wait(120)
        before = _mntr(target)
        got = [results.get(timeout=seconds + 60) for _ in workers]
        after = _mntr(target)
        for worker in workers:
            worker.join(30)
        grants = sum(g for g, _ in got)
        sent: dict[str, int] = {}
        for _, counts in got:
            for kind, count in counts.items():
                sent[kind] = sent.get(kind, 0) + count
        per = {kind: round(count / grants, 2) for kind, count in sorted(sent.items())}
        received, replied = (
            (after[k] - before[k]) / grants for k in ("zk_packets_received", "zk_packets_sent")
        )
        print(
            f"{target}.{name}: {grants} grants; requests per grant {sum(per.values()):.2f} "
            f"{per}; server packets per grant received {received:.2f}, sent {replied:.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=requests_per_grant.__doc__)
    parser.add_argument("--target", choices=sorted(TARGETS), default="zk1")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--duration", type=float, default=3.0)
    options = parser.parse_args()
    setup()
    requests_per_grant(options.target, options.processes, options.duration)
