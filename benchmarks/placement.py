"""``--placement``: where the benchmark's client and the servers it measures run.

On a machine of a few CPUs the scheduler places the client and the server process
that answers it as it likes, and that placement decides a round trip's cost more than
anything the client does: on one CPU a round trip is two context switches and the
two processes evict each other's caches (the client's code slows the server down too);
on two CPUs each round trip wakes the other one, as a database on another machine
does. Left free, a case's server process lands on either for long stretches, and two
cases of one run may land differently: docs/benchmarks.md has ratios that moved from
1.07x to 1.33x between runs of the same code. Pinned, rounds agree within a few
percent.

- ``free`` (the default): nothing is pinned.
- ``same-core``: the client and every server process on the first usable CPU.
- ``cross-core``: the client on the first usable CPU, the servers on the second.

The servers are the processes listening on the TCP ports of the ``DISTLOCK_*``
variables (``scripts/servers.py``'s), with all their threads (MariaDB's connections)
and their child processes (PostgreSQL's backends; the ones forked later inherit the
CPU). The servers' CPUs are given back as they were when the run ends. The processes
a contended case starts inherit the client's CPU: there, ``same-core`` and
``cross-core`` put every contender on one CPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHOICES = ("free", "same-core", "cross-core")
_PORT = re.compile(r"127\.0\.0\.1:(\d+)")
_LISTEN = "0A"  # /proc/net/tcp's state of a listening socket


class PlacementError(Exception):
    """The placement cannot be made here (too few CPUs, no permission)."""


def server_ports(environ: dict[str, str] | None = None) -> set[int]:
    """The loopback ports named by the ``DISTLOCK_*`` variables (URLs, host lists, ports)."""
    env = os.environ if environ is None else environ
    ports: set[int] = set()
    for name, value in env.items():
        if not name.startswith("DISTLOCK_"):
            continue
        if name.endswith("_PORT") and value.isdigit():
            ports.add(int(value))
        ports.update(int(port) for port in _PORT.findall(value))
    return ports


def listeners(ports: set[int]) -> set[int]:
    """The pids of the processes with a listening TCP socket on one of ``ports``."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == _LISTEN and port in ports:
                inodes.add(fields[9])
    found: set[int] = set()
    for pid in _pids():
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        if any(link.startswith("socket:[") and link[8:-1] in inodes for link in links):
            found.add(pid)
    return found


def with_children(pids: set[int]) -> set[int]:
    """``pids`` and every process descended from one of them."""
    parents: dict[int, int] = {}
    for pid in _pids():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
    found = set(pids)
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


def threads(pid: int) -> list[int]:
    """The thread ids of ``pid`` (its own id alone if they cannot be read)."""
    try:
        return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return [pid]


@contextmanager
def placed(placement: str, ports: set[int] | None = None) -> Iterator[str]:
    """Pin this process and the servers for the block (see the module's docstring);
    yield a description for the results' machine line.

    :param placement: one of :data:`CHOICES`.
    :param ports: the servers' ports (default: :func:`server_ports`).

    :raises PlacementError: with fewer than two usable CPUs for ``cross-core``, or when a
        server's CPUs may not be changed by this user.
    """
    if placement not in CHOICES:
        raise ValueError(f"placement must be one of {CHOICES}, not {placement!r}")
    if placement == "free":
        yield "placement free"
        return
    usable = sorted(os.sched_getaffinity(0))
    client = usable[0]
    if placement == "same-core":
        server = client
    elif len(usable) < 2:
        raise PlacementError("cross-core needs two usable CPUs")
    else:
        server = usable[1]
    servers = with_children(listeners(server_ports() if ports is None else ports))
    tasks = [tid for pid in servers for tid in threads(pid)]
    before: dict[int, set[int]] = {}
    mine = os.sched_getaffinity(0)
    try:
        for tid in tasks:
            try:
                before[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {server})
            except ProcessLookupError:  # ended meanwhile
                continue
            except PermissionError as exc:
                raise PlacementError(
                    f"may not pin server process {tid} (run as its user or root)") from exc
        os.sched_setaffinity(0, {client})
        yield (f"placement {placement} (client CPU {client}, {len(tasks)} server threads"
               f" CPU {server})")
    finally:
        os.sched_setaffinity(0, mine)
        for tid, cpus in before.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except (ProcessLookupError, PermissionError):
                continue


def _pids() -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)
