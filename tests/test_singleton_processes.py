"""``manage.py distlock singleton`` with real processes: runners on the shared Redis (and
ZooKeeper) start their command only while they lead; a SIGKILLed runner's child dies
with it (Linux's parent-death signal) and another runner's child starts only after the
term could have ended; a runner told to stop hands over at once; a term taken away
stops the child and the runner leads again under a new epoch; Celery beat run by two
runners, killed in turn, sends each tick once.

The children (``tests/singleton_child.py``) record their intervals: no two may overlap,
and their epochs grow.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from django_distlock import locks
from django_distlock.leadership import LEADER_PREFIX
from django_distlock.singleton import KILL_MARGIN

from .conftest import eventually, require_alias
from .test_flashsale import ROOT

# Single-tier, in the second env: it balances the two lanes of a whole run
# (CONTRIBUTING.md, the tiers).
pytestmark = pytest.mark.second_env

#: The runners' term (s) and grace (s): grace + 0.5 s fits in a third of the term.
TTL, GRACE = 2.4, 0.3
#: A new runner's child starts at most this long after the term could have ended.
SLACK = 2.0
CHILD = str(ROOT / "tests" / "singleton_child.py")


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DISTLOCK_SQLITE_DIR": str(tmp_path)}


def _runner(tmp_path: Path, name: str, using: str, *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "distlock", "singleton", name, "--using", using,
         "--ttl", str(TTL), "--grace", str(GRACE), "--", *command],
        cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _children(path: Path) -> list[dict[str, Any]]:
    """Each child's pid, epoch, start and end (its ``end``, else its last beat), by start."""
    found: dict[int, dict[str, Any]] = {}
    for e in _events(path):
        child = found.setdefault(e["pid"], {"pid": e["pid"], "epoch": e["epoch"],
                                            "start": e["t"], "end": e["t"], "ended": False})
        child["end"] = max(child["end"], e["t"])
        child["ended"] |= e["ev"] == "end"
    return sorted(found.values(), key=lambda c: c["start"])


def _started(path: Path, count: int, timeout: float) -> list[dict[str, Any]]:
    assert eventually(lambda: len(_children(path)) >= count, timeout), _children(path)
    return _children(path)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _stop(*runners: subprocess.Popen[str]) -> str:
    for runner in runners:
        if runner.poll() is None:
            runner.kill()
    return "\n".join(runner.communicate(timeout=30)[1] for runner in runners)


def _no_overlap(children: list[dict[str, Any]]) -> None:
    for before, after in itertools.pairwise(children):
        assert before["end"] < after["start"], (before, after)
        assert after["epoch"] > before["epoch"], (before, after)


@pytest.mark.parametrize("alias", ["redis", "zk"])
def test_one_child_at_a_time_across_killed_and_stopped_runners(alias: str, tmp_path: Path,
                                                               unique) -> None:
    require_alias(alias)
    name, path = unique("single"), tmp_path / "children.jsonl"
    # ZooKeeper: the session timeout, and up to a tick (2 s) more: it expires sessions in
    # buckets of a tick.
    lasts = 4.0 + 2.0 if alias == "zk" else TTL
    a = _runner(tmp_path, name, alias, sys.executable, CHILD, str(path))
    runners = [a]
    try:
        first = _started(path, 1, 30)[0]
        b = _runner(tmp_path, name, alias, sys.executable, CHILD, str(path))
        runners.append(b)
        time.sleep(1.5)  # b is up and waiting to lead
        assert len(_children(path)) == 1
        a.kill()  # SIGKILL: its child dies with it
        killed = time.monotonic_ns()
        assert eventually(lambda: not _alive(first["pid"]), 2), "the child outlived its runner"
        second = _started(path, 2, lasts + 30)[1]
        assert (second["start"] - killed) / 1e9 <= lasts + SLACK
        c = _runner(tmp_path, name, alias, sys.executable, CHILD, str(path))
        runners.append(c)
        time.sleep(1.5)
        b.send_signal(signal.SIGTERM)  # stops its child, ends the term: c leads at once
        assert b.wait(30) == 0
        third = _started(path, 3, 30)[2]
        handed = next(ch for ch in _children(path) if ch["pid"] == second["pid"])
        assert handed["ended"]  # SIGTERM reached the child, which exited
        assert (third["start"] - handed["end"]) / 1e9 < lasts  # no wait for the lease
        c.send_signal(signal.SIGTERM)
        assert c.wait(30) == 0
    finally:
        output = _stop(*runners)
    children = _children(path)
    assert len(children) == 3, (children, output)
    _no_overlap(children)
    assert not locks[alias].is_locked(LEADER_PREFIX + name)


def test_a_term_taken_away_stops_the_child_and_the_runner_leads_again(tmp_path: Path,
                                                                      unique) -> None:
    require_alias("redis")
    name, path = unique("taken"), tmp_path / "children.jsonl"
    runner = _runner(tmp_path, name, "redis", sys.executable, CHILD, str(path))
    try:
        _started(path, 1, 30)
        assert locks["redis"].force_release(LEADER_PREFIX + name)
        _started(path, 2, TTL + 30)
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(30) == 0
    finally:
        output = _stop(runner)
    first, second = _children(path)
    assert first["ended"] and second["ended"], output
    _no_overlap([first, second])
    assert "lost: stopping pid" in output  # the renewal found it gone


def test_a_runner_whose_renewals_fail_stops_its_child_while_the_term_still_lasts(
    tmp_path: Path, unique, own_redis
) -> None:
    """The runner's Redis frozen (SIGSTOP): renewals get no answer; with ``grace`` + 0.5 s
    of the term left on its clock, the runner stops its child (SIGTERM, which the child
    obeys at once), so the child is gone before the term can end on the server (the
    lease counts from a renewal's sending, which the server received later)."""
    name, path = unique("frozen"), tmp_path / "children.jsonl"
    env = {**_env(tmp_path), "DISTLOCK_REDIS_URL": own_redis.url()}
    runner = subprocess.Popen(
        [sys.executable, "-m", "django", "distlock", "singleton", name, "--using", "redis",
         "--ttl", str(TTL), "--grace", str(GRACE), "--", sys.executable, CHILD, str(path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        _started(path, 1, 30)
        time.sleep(1.0)  # a renewal or two
        own_redis.pause()
        paused = time.monotonic_ns()
        assert eventually(lambda: _children(path)[0]["ended"], TTL + 5), _children(path)
        own_redis.resume()
    finally:
        output = _stop(runner)
    child = _children(path)[0]
    stopping = re.search(r"not renewed, ([0-9.]+) s left: stopping pid", output)
    assert stopping, output
    # The runner stopped the child with more than grace left on its clock (which counts
    # the lease from the last renewal's sending: the server's ends later), and the child
    # ended on the SIGTERM (its "end": a SIGKILL after grace would leave none) ...
    assert GRACE < float(stopping.group(1)) <= GRACE + KILL_MARGIN, output
    assert child["ended"] and "did not end within" not in output, output
    # ... so before the lease could end, which is never later than the ttl after the pause.
    assert (child["end"] - paused) / 1e9 < TTL, (child, output)


#: Workers, and the beat ticks to see after each runner's start.
WORKERS, TICKS = 2, 3


def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "tests.schedule_beat_app", *args]


def test_celery_beat_run_by_two_runners_killed_in_turn_sends_each_tick_once(
    tmp_path: Path, unique
) -> None:
    """Beat on two hosts under the runner: one beat at a time, so every tick (one a
    second) is sent once; while a killed runner's term runs out, ticks are missed,
    never doubled."""
    pytest.importorskip("celery")
    require_alias("redis")
    ready, history = tmp_path / "ready", tmp_path / "history.jsonl"
    ready.mkdir()
    env = {**_env(tmp_path), "DISTLOCK_BEAT_QUEUE": unique("beat-queue"),
           "DISTLOCK_BEAT_JOB": unique("beat-job"), "DISTLOCK_BEAT_HISTORY": str(history),
           "DISTLOCK_BEAT_READY": str(ready)}
    workers = [
        subprocess.Popen(
            _celery("worker", "--pool", "solo", "-n", f"w{i}@%h", "--without-gossip",
                    "--without-mingle", "--without-heartbeat", "-l", "warning"),
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(WORKERS)
    ]
    name = unique("beat")

    def runner(i: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "distlock", "singleton", name, "--using", "redis",
             "--ttl", str(TTL), "--grace", str(GRACE), "--",
             *_celery("beat", "-s", str(tmp_path / f"beat{i}"), "--pidfile=",
                      "-l", "warning")],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def ticks() -> set[int]:
        return {json.loads(line)["slot"] for line in
                (history.read_text().splitlines() if history.exists() else [])}

    runners: list[subprocess.Popen[str]] = []
    try:
        assert eventually(lambda: len(list(ready.iterdir())) >= WORKERS, 60)
        runners = [runner(0), runner(1)]
        for i in (2, 3):  # kill the leading runner twice, a new one started each time
            wanted = TICKS * (i - 1)
            assert eventually(lambda wanted=wanted: len(ticks()) >= wanted, 60), ticks()
            leading = [r for r in runners if r.poll() is None and _leads(r, name)]
            assert len(leading) == 1
            leading[0].kill()
            runners.append(runner(i))
        assert eventually(lambda: len(ticks()) >= TICKS * 3, 60), ticks()
    finally:
        output = _stop(*runners)
        for worker in workers:
            worker.terminate()
        output += "\n".join(w.communicate(timeout=60)[0] for w in workers)
    sent = Counter(json.loads(line)["slot"] for line in history.read_text().splitlines())
    assert all(count == 1 for count in sent.values()), (sent, output)
    span = max(sent) - min(sent) + 1
    # Two failovers, each at most the term's TTL (+ a beat's start): a few ticks missed.
    assert span - len(sent) <= 2 * (TTL + 4), (sorted(sent), output)


def _leads(runner: subprocess.Popen[str], name: str) -> bool:
    """Whether ``runner`` holds the term of ``name`` now (its pid is the holder's)."""
    from django_distlock.leadership import current_leader

    info = current_leader(name, using="redis")
    return info is not None and info.pid == runner.pid
