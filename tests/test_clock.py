"""A client whose wall clock jumps (issue 22): validity follows the monotonic clock, and a
jump of the wall clock neither shortens nor extends a lease.

The client is a subprocess (tests/clock_client.py) under libfaketime (Debian's
``faketime``, which ``scripts/test`` installs): ``FAKETIME_TIMESTAMP_FILE`` names a
file this test rewrites to jump the client's wall clock an hour forward or back,
re-read at every call (``FAKETIME_NO_CACHE``); its monotonic clock is left alone
(``DONT_FAKE_MONOTONIC``). Two jumps per backend with expiry:

- the holder's clock jumps forward, then back: its ``valid_until`` and ``lost`` do
  not move, nobody else gets the name before its TTL, and it is free at its TTL (not
  an hour early, not an hour late);
- a contender's clock jumps forward (or back) while this process holds: it does not
  get the name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_distlock import locks

from .conftest import DATABASES, FULL_RUN, LIBRARY_DB, require_memcached
from .figures import record
from .test_hostile import ALIASES, require

pytestmark = [pytest.mark.second_env, LIBRARY_DB]

LIBFAKETIME = [Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
               Path("/usr/lib/faketime/libfaketime.so.1"),
               Path("/usr/local/lib/faketime/libfaketime.so.1")]
TTL = 1.5
JUMP = 3600  # seconds, forward then back
MARGIN = 1.0  # how late past its TTL a lease may be seen free (polling, calls)
#: Where a lease may end later than that, and why (never an hour: the jump).
LATER = {"cache-memcached": 2.0}  # memcached: whole seconds, its clock ticks once a second

CLOCK_ALIASES = ["pg-lease", "mysql-lease", "redis", "redis-cluster", "redlock",
                 "cache-memcached", "cache-redis"]
#: The aliases not jumped here, and why.
NO_CLOCK = {
    "default": "sqlite-lease's backend with another prefix",
    "pg-tx": "no expiry: the lock lives as long as its transaction, no clock involved",
    "mysql-tx": "no expiry: the lock lives as long as its transaction, no clock involved",
    "pg-session": "no expiry: the lock lives as long as its session, no clock involved",
    "mysql-session": "no expiry: the lock lives as long as its session, no clock involved",
    "sqlite-tx": "no expiry: SQLite's write lock, no clock involved",
    "zk": "no expiry: the ZooKeeper session's timeout is the server's to judge",
    "zk-auth": "no expiry (ZooKeeper)",
    "locmem": "process-local: a jumped subprocess has its own lock table (its validity is "
    "time.monotonic() in the same code as every backend's handle)",
    "redis-cache": "the 'redis' scripts through another client: 'redis' is jumped",
    "redis-djcache": "the 'redis' scripts through another client: 'redis' is jumped",
    "redis-unfair": "the 'redis' scripts: 'redis' is jumped",
    "redis-decoded": "the 'redis' scripts: 'redis' is jumped",
    "sqlite-lease": "SQLite has no server clock: a lease's expiry is written and compared "
    "by each client's wall clock (SQLite's 'now'), so a client whose clock jumps forward "
    "sees others' leases over; its clients must share one clock (docs/database.md). "
    "test_a_jumped_sqlite_client_takes_a_held_lease shows it",
}


def test_every_alias_is_jumped_or_left_with_a_reason() -> None:
    assert set(CLOCK_ALIASES) | set(NO_CLOCK) == set(ALIASES) | {"cache-memcached",
                                                                  "cache-redis"}


def _libfaketime() -> Path:
    found = next((path for path in LIBFAKETIME if path.exists()), None)
    if found is None:
        if FULL_RUN:
            pytest.fail("libfaketime is missing: apt-get install faketime (scripts/test does)")
        pytest.skip("libfaketime is not installed")
    return found


class Client:
    """The jumped client: one subprocess of tests/clock_client.py on one alias."""

    def __init__(self, alias: str, directory: Path) -> None:
        self.clock = directory / "faketime"
        self.clock.write_text("+0\n")
        names = {db: connections[db].settings_dict["NAME"] for db in settings.DATABASES
                 if db in DATABASES}
        env = dict(os.environ, LD_PRELOAD=str(_libfaketime()), DONT_FAKE_MONOTONIC="1",
                   FAKETIME_TIMESTAMP_FILE=str(self.clock), FAKETIME_NO_CACHE="1",
                   DISTLOCK_CLOCK_DATABASES=json.dumps(names))
        env.pop("DISTLOCK_FIGURES", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.clock_client", alias], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent,
        )
        self.start = self._reply()
        assert self.start.get("ready"), self.start

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the client exited ({self.proc.poll()})"
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, *words: object) -> dict[str, Any]:
        """Send one command; its JSON answer (an error is a failed test)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        reply = self._reply()
        assert "error" not in reply, reply
        return reply

    def jump(self, offset: int) -> None:
        """Set the client's wall clock ``offset`` seconds from the true time."""
        self.clock.write_text(f"{offset:+d}\n")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A factory of jumped clients on an alias, closed at the end."""
    made: list[Client] = []

    def make(alias: str) -> Client:
        made.append(Client(alias, tmp_path))
        return made[-1]

    yield make
    for one in made:
        one.close()


def _require(alias: str) -> None:
    if alias == "cache-memcached":
        require_memcached()
    else:
        require(alias)


def _jumped_by(reply: dict[str, Any], offset: int) -> float:
    """How far the client's wall clock is from this process' (seconds)."""
    return float(reply["wall"]) - time.time() - offset


@pytest.mark.parametrize("alias", CLOCK_ALIASES)
def test_a_jumping_wall_clock_neither_shortens_nor_extends_a_lease(
        alias: str, client: Any, unique) -> None:
    _require(alias)
    backend, jumped = locks[alias], client(alias)
    name = unique("jumped-holder")
    granted = jumped.ask("acquire", name, TTL)
    granted_at = time.monotonic()
    assert granted["won"] and granted["valid_until"] is not None, granted
    for offset in (JUMP, -JUMP):
        jumped.jump(offset)
        state = jumped.ask("state", name)
        assert abs(_jumped_by(state, offset)) < 5, state  # the jump took
        assert state["valid_until"] == granted["valid_until"] and not state["lost"], state
        other = backend.lock(name, ttl=TTL)
        assert not other.acquire(blocking=False), f"a {offset:+d} s jump shortened the lease"
    jumped.jump(0)
    freed, bound = backend.lock(name, ttl=TTL), TTL + MARGIN + LATER.get(alias, 0.0)
    while not freed.acquire(blocking=False):
        assert time.monotonic() < granted_at + bound, "a jump extended the lease"
        time.sleep(0.02)
    free_after = time.monotonic() - granted_at
    freed.release()
    assert free_after >= TTL - 0.2, free_after  # (the grant came a little before granted_at)

    # A contender whose clock jumps does not take a lease held here.
    held = backend.lock(unique("jumped-contender"), ttl=30)
    assert held.acquire(blocking=False)
    worst = 0.0
    try:
        for offset in (JUMP, -JUMP):
            jumped.jump(offset)
            began = time.monotonic()
            attempt = jumped.ask("acquire", held.name, TTL)
            worst = max(worst, time.monotonic() - began)
            assert not attempt["won"], f"a client {offset:+d} s off took a held lease"
    finally:
        held.release()
    jumped.jump(JUMP)
    assert jumped.ask("acquire", held.name, TTL)["won"]  # and takes it once free
    jumped.ask("release", held.name)
    record("clock-jump", alias, processes=2, acquisitions=6, overlaps=0, jump_s=JUMP,
           free_after_s=round(free_after, 3), bound_s=bound,
           worst_call_s=round(worst, 3))


def test_a_jumped_sqlite_client_takes_a_held_lease(client: Any, unique) -> None:
    """What NO_CLOCK says of SQLite, shown (so that the day it changes, this fails): a
    client whose wall clock is an hour ahead takes a lease this process holds."""
    backend, jumped = locks["sqlite-lease"], client("sqlite-lease")
    held = backend.lock(unique("sqlite-jumped"), ttl=30)
    assert held.acquire(blocking=False)
    try:
        jumped.jump(JUMP)
        assert jumped.ask("acquire", held.name, TTL)["won"]
        jumped.ask("release", held.name)
    finally:
        with pytest.raises(Exception):  # noqa: B017  (LockLost: the jumped client took it)
            held.release()
