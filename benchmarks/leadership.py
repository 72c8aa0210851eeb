"""Suite ``leadership``: failover after a SIGKILLed leader, and what a held term costs.

One row per backend that can lead (``django_distlock.leadership``): the database's lease
mode on PostgreSQL (alias ``pg``) and on MariaDB (``mysql``), Redis (``redis``, one
server) and ZooKeeper (``zk``, the 3-node ensemble); and kazoo's own
``kazoo.recipe.election.Election`` on the same ensemble, with a ``KazooClient`` of the
same session timeout as the ``zk`` alias, as the peer (the reference of the ratio
column). Lease rows lead with ``ttl`` :data:`TTL` (renewed every third of it); the
ZooKeeper rows' term lasts the session, ``SESSION_TIMEOUT`` of the ``zk`` alias.

**Failover**, per ``--repeat`` round: two candidate OS processes (``spawn``, each setting
Django up) campaign for a leadership name of the round's own. When one leads, both are
campaigning, and the leader has just sent a request that extends its term (a renewal
of its lease returned, a kazoo ping was written: the worst moment to die, its term then
lasts the longest), this process SIGKILLs the leader and reads ``time.monotonic()``
(``CLOCK_MONOTONIC``: one clock for every process of the machine). The other
candidate's first act as leader reads the same clock and sends it on its pipe (a pipe
per process: a shared queue or event could be left locked by the killed one): failover
= that time - the kill's. The new leader's epoch must be higher than the killed one's
(kazoo's ``Election`` has none). Reported: p50 and max over the rounds, the setting
that bounds it (the lease's ``ttl``, the session timeout), and the max minus it.

**Term cost**, per round: one process leads for ``--duration`` seconds (from half a
second after its grant) and counts, in that process, the requests it sends to the lock
server while it just holds the term: calls of the watchdog's
``django_distlock.hold.Hold.renew`` (one round trip each: a lease renewal) and, for the
ZooKeeper rows, every packet kazoo's connection writes
(``kazoo.protocol.connection.ConnectionHandler._submit``: its pings and any request).
Both are counted on every row (a lease row writes no kazoo packet, a ZooKeeper term
renews nothing). Requests/s = the count over all rounds / their seconds. Nothing else
campaigns for the name meanwhile: a waiter's requests are not in it. (Checked once
against the servers' own counters: a Redis renewal is one ``EVALSHA``, a MariaDB
renewal one ``CALL``.)
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from .harness import (
    Case,
    Column,
    Options,
    Row,
    Suite,
    Unavailable,
    add_case,
    add_suite,
    ms,
    percentile,
    progress,
)

NAME = "leadership"
#: The lease of the lease backends' terms (s): a SIGKILLed leader is replaced after it.
TTL = 3.0
#: The kazoo ``Election``'s root on the ensemble (the ``zk`` alias' is its own ``ROOT``).
ELECTION_ROOT = "/distlock-bench-election"
#: Seconds a process may take to start, set Django up and lead or campaign.
STARTUP_TIMEOUT = 120.0
#: Both candidates said they campaign at least this long before the kill (s).
SETTLE = 0.2
#: The term-cost window begins this long after the grant (s).
COST_OFFSET = 0.5
ALLOWED_HOSTS = ("127.0.0.1",)


# --------------------------------------------------------------------------- in a candidate


def _instrument(hook: Callable[[str], None]) -> None:
    """Call ``hook`` in this process after each request to the lock server that a held
    term sends: ``"renewal"`` (the watchdog's ``Hold.renew``, with ``"renewed"`` once
    more when it kept the lease), ``"ping"`` and ``"request"`` (a packet kazoo wrote)."""
    from django_distlock.hold import Hold

    renew = Hold.renew

    def counted_renew(self: Hold, acquisition: Any, ttl: float) -> bool | None:
        renewed: bool | None = None
        try:
            renewed = renew(self, acquisition, ttl)
            return renewed
        finally:
            hook("renewal")
            if renewed:
                hook("renewed")

    setattr(Hold, "renew", counted_renew)  # noqa: B010  (a method replaced in this process)
    if importlib.util.find_spec("kazoo") is None:
        return
    from kazoo.protocol.connection import ConnectionHandler
    from kazoo.protocol.serialization import Ping

    submit = ConnectionHandler._submit

    def counted_submit(self: ConnectionHandler, request: Any, timeout: float,
                       xid: int | None = None) -> None:
        submit(self, request, timeout, xid)
        hook("ping" if isinstance(request, Ping) else "request")

    setattr(ConnectionHandler, "_submit", counted_submit)  # noqa: B010


def _kazoo_client() -> Any:
    """A started ``KazooClient`` on the ``zk`` alias' ensemble, with its session timeout."""
    from kazoo.client import KazooClient

    from django_distlock import locks

    settings = locks["zk"].settings  # type: ignore[attr-defined]
    client = KazooClient(hosts=settings.hosts, timeout=settings.session_timeout)
    client.start(timeout=30)
    return client


def _lead(kind: str, alias: str, name: str, act: Callable[[int | None], None]) -> None:
    """Campaign for ``name`` until this process leads, call ``act(epoch)``, end the term."""
    if kind == "kazoo":
        client = _kazoo_client()
        try:
            election = client.Election(f"{ELECTION_ROOT}/{name}", str(os.getpid()))
            election.run(act, None)
        finally:
            client.stop()
            client.close()
        return
    from django_distlock.leadership import leadership

    ttl: dict[str, float] = {} if kind == "zk" else {"ttl": TTL}
    with leadership(name, using=alias, **ttl) as term:
        act(term.epoch)
        term.lost  # noqa: B018  (read: a loss was seen, the exit does not raise)


class _Link:
    """A child's end of its pipe to this process: events out (from any of its threads),
    the word to stop in. A pipe per child, not a shared queue or event: a SIGKILLed
    leader may die holding their cross-process locks, and hang the others."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pid = os.getpid()
        self.mutex = threading.Lock()

    def say(self, what: str, *values: Any) -> None:
        with self.mutex:
            self.conn.send((what, self.pid, *values))

    def stopped(self, timeout: float) -> bool:
        """Wait until the benchmark's process says stop (or is gone), at most ``timeout`` s."""
        return self.conn.poll(timeout)


def _candidate(kind: str, alias: str, name: str, conn: Connection) -> None:
    """A failover candidate: says when it campaigns, leads, and renews or pings."""
    link = _Link(conn)
    try:
        from . import lockers

        lockers.django_setup()

        def beat(what: str) -> None:
            if what in ("renewed", "ping"):
                link.say("beat", time.monotonic())

        _instrument(beat)

        def act(epoch: int | None) -> None:
            link.say("lead", time.monotonic(), epoch)  # the first act
            link.stopped(STARTUP_TIMEOUT)

        link.say("ready", time.monotonic())
        _lead(kind, alias, name, act)
        link.say("done")
    except BaseException:
        link.say("error", traceback.format_exc())


def _holder(kind: str, alias: str, name: str, window: float, conn: Connection) -> None:
    """The term-cost process: leads, counts its requests over ``window`` seconds."""
    link = _Link(conn)
    try:
        from . import lockers

        lockers.django_setup()
        sent = [0]

        def count(what: str) -> None:
            if what != "renewed":
                sent[0] += 1

        _instrument(count)

        def act(epoch: int | None) -> None:
            time.sleep(COST_OFFSET)
            began, before = time.monotonic(), sent[0]
            time.sleep(window)
            link.say("cost", sent[0] - before, time.monotonic() - began)

        _lead(kind, alias, name, act)
    except BaseException:
        link.say("error", traceback.format_exc())


# --------------------------------------------------------------------------- the rounds


def _kind_alias(case: Case) -> tuple[str, str]:
    return case.factory.args  # type: ignore[attr-defined]


def _name(case: Case) -> str:
    return f"bench:{NAME}:{case.name}:{os.getpid()}:{time.time_ns()}"


class _Children:
    """Processes started with a pipe each, and their events as they come."""

    def __init__(self, target: Callable[..., None], *args: Any, count: int = 1) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ends: dict[Connection, BaseProcess] = {}
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        for _ in range(count):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=target, args=(*args, theirs), daemon=True)
            proc.start()
            theirs.close()
            self.ends[mine] = proc
            self.procs.append(proc)
            self.conns.append(mine)

    def next(self, until: float, what: str) -> tuple[Any, ...]:
        """The next event of any child (a child's error raised), by ``until``."""
        while True:
            ready = wait(list(self.ends), timeout=max(until - time.monotonic(), 0.0))
            if not ready:
                raise RuntimeError(f"{NAME}: no event while waiting for {what}")
            for conn in ready:
                assert isinstance(conn, Connection)
                try:
                    event: tuple[Any, ...] = conn.recv()
                except (EOFError, OSError):
                    del self.ends[conn]  # the child is gone (killed, or ended)
                    if not self.ends:
                        raise RuntimeError(f"{NAME}: every process ended before {what}"
                                           ) from None
                    continue
                if event[0] == "error":
                    raise RuntimeError(f"{NAME}: process {event[1]} failed:\n{event[2]}")
                return event

    def close(self) -> None:
        """Tell the children to stop, wait for them (kill those that do not end)."""
        for conn in self.ends:
            with contextlib.suppress(OSError):
                conn.send("stop")
        for proc in self.procs:
            proc.join(STARTUP_TIMEOUT)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()


def _failover(case: Case) -> float:
    """One round: the seconds from the leader's SIGKILL to the other candidate's lead."""
    kind, alias = _kind_alias(case)
    children = _Children(_candidate, kind, alias, _name(case), count=2)
    try:
        ready: dict[int, float] = {}
        leader, epoch = 0, None
        until = time.monotonic() + STARTUP_TIMEOUT
        while True:
            event = children.next(until, "a lead and a renewal")
            if event[0] == "ready":
                ready[event[1]] = event[2]
            elif event[0] == "lead":
                if leader:
                    raise RuntimeError(f"{case.name}: two leaders before the kill")
                leader, epoch = event[1], event[3]
            elif (event[0] == "beat" and event[1] == leader and len(ready) == 2
                  and event[2] >= max(ready.values()) + SETTLE):
                break
        os.kill(leader, signal.SIGKILL)
        killed = time.monotonic()
        until = killed + _bound(case) * 3 + 30
        while True:
            event = children.next(until, "the next leader")
            if event[0] == "lead":
                break
        if event[1] == leader:
            raise RuntimeError(f"{case.name}: the killed process led again")
        if epoch is not None and not event[3] > epoch:
            raise RuntimeError(f"{case.name}: epoch {event[3]} after {epoch}")
        return float(event[2] - killed)
    finally:
        children.close()


def _term_cost(case: Case, window: float) -> tuple[int, float]:
    """One round: the requests one leader sent while it held its term, and the seconds."""
    kind, alias = _kind_alias(case)
    children = _Children(_holder, kind, alias, _name(case), window)
    try:
        event = children.next(time.monotonic() + STARTUP_TIMEOUT + window, "the count")
        return int(event[2]), float(event[3])
    finally:
        children.close()


def _bound(case: Case) -> float:
    """The setting that bounds the failover: the lease, or the ``zk`` session timeout."""
    kind, _ = _kind_alias(case)
    if kind in ("zk", "kazoo"):
        from django_distlock import locks

        return float(locks["zk"].settings.session_timeout)  # type: ignore[attr-defined]
    return TTL


def run(cases: Sequence[Case], options: Options) -> list[Row]:
    """Every case's failover and term cost ``--repeat`` times, interleaved; a row each."""
    failovers: dict[str, list[float]] = {case.name: [] for case in cases}
    costs: dict[str, list[tuple[int, float]]] = {case.name: [] for case in cases}
    for round_ in range(options.repeat):
        for case in cases:
            progress(f"{NAME}: {case.name}, round {round_ + 1}/{options.repeat}: failover")
            failovers[case.name].append(_failover(case))
            progress(f"{NAME}: {case.name}, round {round_ + 1}/{options.repeat}: "
                     f"term cost ({options.duration:g} s)")
            costs[case.name].append(_term_cost(case, options.duration))
    rows = []
    for case in cases:
        times = sorted(failovers[case.name])
        sent = sum(n for n, _ in costs[case.name])
        seconds = sum(s for _, s in costs[case.name])
        rows.append(Row(case, {
            "failover_p50": percentile(times, 50) * 1e9,
            "failover_max": max(times) * 1e9,
            "bound": _bound(case),
            "over_bound": (max(times) - _bound(case)) * 1e9,
            "requests": f"{sent} in {seconds:.1f} s",
            "rate": sent / seconds if seconds else math.nan,
        }))
    return rows


# --------------------------------------------------------------------------- smoke, setup


def smoke(case: Case) -> None:
    """``--smoke``: lead the case's name once in this process and end the term.

    :raises AssertionError: when the term was not held, or lost at once.
    """
    kind, alias = _kind_alias(case)
    led: list[int | None] = []

    def act(epoch: int | None) -> None:
        led.append(epoch)

    _lead(kind, alias, f"bench:smoke:{NAME}:{case.name}:{time.time_ns()}", act)
    if len(led) != 1 or (kind != "kazoo" and not isinstance(led[0], int)):
        raise AssertionError(f"{case.name}: led {led}")


def _zookeeper_hosts() -> str:
    return os.environ.get("DISTLOCK_ZK_HOSTS", "")


def setup() -> None:
    """Set the configured servers up as their own modules do (the rows of a server whose
    variable is unset were not registered); remove the kazoo ``Election``'s root.

    :raises Unavailable: when no server that can lead is configured.
    :raises SystemExit: when a configured server is not on 127.0.0.1.
    """
    if not _CASES:
        raise Unavailable("no server that can lead is configured: run scripts/bench, or "
                          "export DISTLOCK_PG_PORT, DISTLOCK_MYSQL_PORT, DISTLOCK_REDIS_URL "
                          "or DISTLOCK_ZK_HOSTS")
    from . import lockers

    lockers.django_setup()
    if os.environ.get("DISTLOCK_PG_PORT"):
        from . import pg

        pg.setup()
    if any(case[2] == "mysql" for case in _CASES):
        from . import mysql

        mysql.setup()
    if os.environ.get("DISTLOCK_REDIS_URL"):
        from . import redis

        redis.setup()
    if _zookeeper_hosts():
        for host in _zookeeper_hosts().split(","):
            if host.rsplit(":", 1)[0] not in ALLOWED_HOSTS:
                raise SystemExit(f"benchmarks: refusing to target ZooKeeper on {host!r}")
        client = _kazoo_client()
        try:
            client.delete(ELECTION_ROOT, recursive=True)
        finally:
            client.stop()
            client.close()


def describe() -> str:
    """The servers' and clients' versions, and the settings that bound a failover."""
    parts = []
    if os.environ.get("DISTLOCK_PG_PORT"):
        from . import pg

        parts.append(pg.describe())
    if any(case[2] == "mysql" for case in _CASES):
        from . import mysql

        parts.append(mysql.describe())
    if os.environ.get("DISTLOCK_REDIS_URL"):
        from . import redis

        parts.append(redis.describe().split(";")[0] + " (one server)")
    if _zookeeper_hosts():
        from importlib.metadata import version

        from django_distlock import locks

        client = _kazoo_client()
        try:
            first = client.command(b"srvr").splitlines()[0]  # "Zookeeper version: 3.8.0-..."
            conf = dict(line.split("=", 1) for line in client.command(b"conf").splitlines()
                        if "=" in line)
        finally:
            client.stop()
            client.close()
        server = first.split(":", 1)[1].strip().split("-")[0]
        timeout = locks["zk"].settings.session_timeout  # type: ignore[attr-defined]
        # tickTime: the server expires sessions in buckets of it (a failover's slack)
        parts.append(f"ZooKeeper {server} (3-node ensemble, tickTime {conf.get('tickTime')} "
                     f"ms; `zk` SESSION_TIMEOUT {timeout:g} s); kazoo {version('kazoo')}")
    return "; ".join(parts)


def _notes(options: Options) -> str:
    return (
        f"Failover, {options.repeat} round(s) a row: two candidate processes; the leader "
        "is SIGKILLed right after a renewal of its lease returned (ZooKeeper rows: right "
        "after kazoo wrote a ping), its term's longest end; failover: from the kill to the "
        "other's first act as leader (`CLOCK_MONOTONIC`, one clock for both). bound: the "
        f"lease rows' `ttl` ({TTL:g} s, renewed every {TTL / 3:g} s), the ZooKeeper rows' "
        "session timeout (the `zk` alias' `SESSION_TIMEOUT`; kazoo's `Election` on a "
        "`KazooClient` of the same timeout); max over bound: the max minus it. Term cost: "
        f"one leader holds its term {options.duration:g} s a round; counted in its process, "
        "`Hold.renew` calls and the packets kazoo writes (pings, requests). x kazoo: "
        "failover p50 over kazoo `Election`'s, on the same ensemble."
    )


add_suite(
    Suite(
        name=NAME,
        title="Leadership: failover after a SIGKILLed leader, and what a held term costs",
        run=run,
        columns=(
            Column("failover_p50", "failover p50 ms", ms),
            Column("failover_max", "failover max ms", ms),
            Column("bound", "bound s", lambda v: f"{v:g}"),
            Column("over_bound", "max over bound ms", ms),
            Column("requests", "term requests"),
            Column("rate", "term requests/s", lambda v: "n/a" if math.isnan(v) else f"{v:.2f}"),
        ),
        ratio_metric="failover_p50",
        notes=_notes,
        smoke=smoke,
    )
)


def _kind(kind: str, alias: str, key: str) -> Any:
    """The case factory's stand-in: a case here is a kind of candidate and an alias."""
    raise TypeError(f"{NAME} cases start processes, they build no Locker ({kind}, {key})")


#: (case, kind, alias, what, group, reference): the rows of the configured servers.
_CASES: list[tuple[str, str, str, str, str, str | None]] = []
if os.environ.get("DISTLOCK_PG_PORT"):
    _CASES.append(("pg.leader", "lease", "pg", "database lease mode, PostgreSQL", "postgres",
                   None))
if os.environ.get("DISTLOCK_MYSQL_PORT") and importlib.util.find_spec("MySQLdb"):
    _CASES.append(("mysql.leader", "lease", "mysql", "database lease mode, MariaDB", "mariadb",
                   None))
if os.environ.get("DISTLOCK_REDIS_URL"):
    _CASES.append(("redis.leader", "lease", "redis", "Redis, one server", "redis", None))
if _zookeeper_hosts() and importlib.util.find_spec("kazoo"):
    _CASES.append(("zk.leader", "zk", "zk", "ZooKeeper, 3-node ensemble", "zookeeper", None))
    _CASES.append(("zk.election", "kazoo", "zk", "kazoo `Election`, same ensemble and "
                   "session timeout", "zookeeper", "kazoo"))
for _name_, _kind_name, _alias, _what, _group, _reference in _CASES:
    add_case(NAME, _name_, functools.partial(_kind, _kind_name, _alias), _what, group=_group,
             reference=_reference)
