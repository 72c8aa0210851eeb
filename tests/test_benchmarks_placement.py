"""``python -m benchmarks --placement``: the servers it pins are the processes that
listen on the run's ports (with their threads and children), pinned for the run and
given their CPUs back after. A real listening process stands for a server here."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from benchmarks.placement import (
    PlacementError,
    listeners,
    placed,
    server_ports,
    threads,
    with_children,
)

#: A server stand-in: listens on a loopback port (printed once its child, which closes
#: its copy of the socket as a PostgreSQL backend does, has done so), then sleeps.
_SERVER = """
import os, socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
r, w = os.pipe()
if os.fork() == 0:
    s.close(); os.write(w, b"x"); time.sleep(60); os._exit(0)
os.read(r, 1)
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


@pytest.fixture
def server() -> Iterator[tuple[subprocess.Popen[str], int]]:
    process = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout is not None
        yield process, int(process.stdout.readline())
    finally:
        for pid in with_children({process.pid}) - {process.pid}:
            os.kill(pid, 9)
        process.kill()
        process.wait()


def test_server_ports_are_read_from_the_runs_variables() -> None:
    env = {
        "DISTLOCK_PG_PORT": "5432",
        "DISTLOCK_REDIS_URL": "redis://127.0.0.1:6379/0",
        "DISTLOCK_ZK_HOSTS": "127.0.0.1:2181,127.0.0.1:2182",
        "DISTLOCK_PG_HOST": "127.0.0.1",
        "OTHER_PORT": "1",
    }
    assert server_ports(env) == {5432, 6379, 2181, 2182}


def test_the_listener_of_a_port_and_its_children_are_found(server) -> None:
    process, port = server
    assert listeners({port}) == {process.pid}
    family = with_children({process.pid})
    assert process.pid in family and len(family) == 2  # the forked child too


def test_same_core_pins_client_and_server_and_gives_the_servers_cpus_back(server) -> None:
    process, port = server
    before = {tid: os.sched_getaffinity(tid) for pid in with_children({process.pid})
              for tid in threads(pid)}
    mine = os.sched_getaffinity(0)
    cpu = min(mine)
    with placed("same-core", {port}) as where:
        assert os.sched_getaffinity(0) == {cpu}
        for tid in before:
            assert os.sched_getaffinity(tid) == {cpu}
        assert "same-core" in where
    assert os.sched_getaffinity(0) == mine
    assert {tid: os.sched_getaffinity(tid) for tid in before} == before


def test_cross_core_puts_the_servers_on_another_cpu(server) -> None:
    process, port = server
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        with pytest.raises(PlacementError, match="two usable CPUs"), placed("cross-core", {port}):
            pass
        return
    before = os.sched_getaffinity(process.pid)
    with placed("cross-core", {port}):
        assert os.sched_getaffinity(0) == {usable[0]}
        assert os.sched_getaffinity(process.pid) == {usable[1]}
    assert os.sched_getaffinity(process.pid) == before


def test_free_pins_nothing_and_a_bad_placement_is_refused(server) -> None:
    process, port = server
    before = os.sched_getaffinity(process.pid)
    with placed("free", {port}) as where:
        assert os.sched_getaffinity(process.pid) == before
        assert where == "placement free"
    with pytest.raises(ValueError, match="placement must be one of"), placed("near", {port}):
        pass
