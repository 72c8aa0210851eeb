"""``manage.py restock`` on several nodes at once: one run per schedule slot, counted.

Each node is a ``manage.py restock`` process of ``testproject`` (the demo shop),
as every machine of a site would run it from its own schedule. Two forms:

- a node's own scheduler (``--every``): 4 processes per backend fire the job at
  every multiple of ``EVERY`` seconds of their clock, for ``SLOTS`` slots; one
  of them has a clock ``SKEW`` seconds behind the others, so it fires every slot
  that much late. With ``min_hold`` above the skew and below the period, every
  slot must have exactly one run. The same firing with ``min_hold=0`` is the
  control that shows the test can fail: the late node runs the slot again. The
  nodes start together: each says "ready" once connected, then reads the time
  of the first slot (``--start -``), so a slow start on a busy machine misses no
  slot.
- cron's form: a crontab line on each node starts ``manage.py restock`` at the
  same moment, so 4 fresh processes race; one runs, and a late cron a second
  later finds the slot kept (the shop's own ``min_hold``).

Counts come from the history every firing appends to (node, slot, ran); no
assertion reads a clock. The backends: the database lease on SQLite (the demo's
database) and on PostgreSQL, and Redis; all groups run at the same time.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from .conftest import require_pg, require_redis
from .test_flashsale import ROOT, _create_database, _env

# Single-tier, in the second env: it balances the two lanes of a whole run
# (CONTRIBUTING.md, the tiers).
pytestmark = pytest.mark.second_env

NODES = 4
SLOTS = 3
#: The schedule's period (s), the late node's clock skew (s), the lock's min_hold (s):
#: SKEW < MIN_HOLD < EVERY, with margins for the processes' scheduling on a busy machine.
EVERY = 3.0
SKEW = 1.0
MIN_HOLD = 2.0
#: Seconds from the moment every node is up and connected to the first slot.
LEAD = 0.5


def _restock(env: dict[str, str], *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "manage.py", "restock", *options],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )


def _finish(procs: list[subprocess.Popen[str]], timeout: float = 120) -> list[str]:
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"restock exited with {proc.returncode}:\n{out}\n{err}"
        outputs.append(out)
    return outputs


def _migrate(envs: list[dict[str, str]]) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for env in envs
    ]
    _finish(procs, timeout=300)


def _runs(history: Path) -> tuple[dict[int, int], dict[int, int]]:
    """Runs and firings per slot, from the history file."""
    runs: Counter[int] = Counter()
    firings: Counter[int] = Counter()
    for line in history.read_text().splitlines():
        entry = json.loads(line)
        firings[entry["slot"]] += 1
        runs[entry["slot"]] += entry["ran"]
    return dict(runs), dict(firings)


@pytest.mark.servers
def test_one_run_per_slot_across_nodes(tmp_path: Path) -> None:
    require_pg()
    require_redis()
    pg_name = f"{os.environ.get('DISTLOCK_PG_NAME', 'distlock')}_restock"
    _create_database(pg_name)
    redis_url = os.environ["DISTLOCK_REDIS_URL"]
    sqlite_env = _env(DISTLOCK_SQLITE_PATH=str(tmp_path / "shop.sqlite3"))
    redis_env = _env(DISTLOCK_SQLITE_PATH=str(tmp_path / "shop-redis.sqlite3"))
    pg_env = _env(**{k: v for k, v in os.environ.items() if k.startswith("DISTLOCK_PG_")})
    pg_env["DISTLOCK_PG_NAME"] = pg_name
    # The control locks on another Redis database number, so its keys are its own.
    control_env = dict(redis_env, DISTLOCK_REDIS_URL=redis_url.rsplit("/", 1)[0] + "/6")
    _migrate([sqlite_env, redis_env, pg_env])

    groups = {
        "sqlite lease": (sqlite_env, "default", MIN_HOLD),
        "postgresql lease": (pg_env, "default", MIN_HOLD),
        "redis": (redis_env, "redis", MIN_HOLD),
        "redis, min_hold=0 (control)": (control_env, "redis", 0.0),
    }
    procs: dict[str, list[subprocess.Popen[str]]] = defaultdict(list)
    for group, (env, alias, min_hold) in groups.items():
        history = tmp_path / f"{group}.jsonl"
        for node in range(NODES):
            late = node == NODES - 1
            procs[group].append(_restock(
                env, "--every", str(EVERY), "--slots", str(SLOTS), "--start", "-",
                "--using", alias, "--min-hold", str(min_hold), "--max-hold", "30",
                "--clock-offset", str(-SKEW if late else 0.0),
                "--node", "late" if late else f"node{node}", "--history", str(history),
            ))
    every_proc = [proc for group in groups for proc in procs[group]]
    for proc in every_proc:  # each has set Django up and connected to its lock server
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", _finish([proc])
    # Half a period before the first slot: every node, skewed or not, counts the
    # same first slot (the skew is under half a period).
    start = (math.ceil((time.time() + LEAD) / EVERY) - 0.5) * EVERY
    for proc in every_proc:
        assert proc.stdin is not None
        proc.stdin.write(f"{start}\n")
        proc.stdin.flush()  # communicate() closes it
    for group in groups:
        _finish(procs[group])

    for group in groups:
        runs, firings = _runs(tmp_path / f"{group}.jsonl")
        assert len(firings) == SLOTS, (group, firings)
        # Every slot was fired by several nodes (the race happened) ...
        assert all(count >= 2 for count in firings.values()), (group, firings)
        if group.endswith("(control)"):
            # ... and without min_hold the late node runs a slot already run.
            assert any(count > 1 for count in runs.values()), (group, runs)
        else:
            # ... and exactly one node ran each slot, the late one included.
            assert runs == dict.fromkeys(firings, 1), (group, runs, firings)

    # Cron's form: 4 fresh processes started at the same moment; then a late cron.
    time.sleep(MIN_HOLD)  # the last slot's lock has ended
    crons = [_restock(sqlite_env) for _ in range(NODES)]
    time.sleep(SKEW)
    crons.append(_restock(sqlite_env))  # a node whose cron fires a second late
    outputs = _finish(crons)
    assert sum("restocked" in out for out in outputs) == 1, outputs
    assert sum("skipped" in out for out in outputs) == NODES, outputs
    assert "skipped" in outputs[-1]  # kept for the shop's MIN_HOLD (20 s): ran by another


def _celery(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.schedule_beat_app", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _stop(procs: list[subprocess.Popen[str]]) -> str:
    """SIGTERM (Celery's warm shutdown), then the processes' output."""
    for proc in procs:
        proc.terminate()
    return "\n".join(proc.communicate(timeout=60)[0] for proc in procs)


#: Workers, their prefork children each, beats, and slots fired.
WORKERS, CHILDREN, BEATS, BEAT_SLOTS = 2, 2, 2, 5


@pytest.mark.servers
def test_celery_beat_on_every_node_runs_each_slot_once(tmp_path: Path) -> None:
    """Beat started on two nodes sends every tick twice; several workers race for it."""
    pytest.importorskip("celery")
    require_redis()
    ready = tmp_path / "ready"
    ready.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DISTLOCK_BEAT_QUEUE": f"distlock-beat-{os.getpid()}-{time.time_ns()}",
        "DISTLOCK_BEAT_JOB": f"beat-restock-{os.getpid()}-{time.time_ns()}",
        "DISTLOCK_BEAT_HISTORY": str(tmp_path / "history.jsonl"),
        "DISTLOCK_BEAT_READY": str(ready),
        "DISTLOCK_SQLITE_DIR": str(tmp_path),
    }
    workers = [
        _celery(
            "worker", "--pool", "prefork", "--concurrency", str(CHILDREN), "-n", f"w{i}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "warning",
            env=env,
        )
        for i in range(WORKERS)
    ]
    beats: list[subprocess.Popen[str]] = []
    try:
        deadline = time.monotonic() + 60
        while len(list(ready.iterdir())) < WORKERS:
            assert time.monotonic() < deadline, "the Celery workers did not start"
            assert all(w.poll() is None for w in workers), _stop(workers)
            time.sleep(0.1)
        beats = [
            _celery("beat", "-s", str(tmp_path / f"beat{i}"), "--pidfile=", "-l", "warning",
                    env=env)
            for i in range(BEATS)
        ]
        history = tmp_path / "history.jsonl"
        deadline = time.monotonic() + 60
        while True:  # until the beats have fired BEAT_SLOTS slots after their first
            slots = {json.loads(line)["slot"] for line in
                     (history.read_text().splitlines() if history.exists() else [])}
            if len(slots) > BEAT_SLOTS + 1:
                break
            assert time.monotonic() < deadline, f"the beats fired too few slots: {slots}"
            time.sleep(0.2)
    finally:
        output = _stop(beats) + _stop(workers)
    runs, firings = _runs(tmp_path / "history.jsonl")
    # The first and last slots may have been fired by one beat only (started and
    # stopped between them); the slots between were sent by both (a beat starved of
    # CPU for a whole period may fire one slot late, for the next: at most one).
    inner = sorted(firings)[1:-1]
    assert len(inner) >= BEAT_SLOTS, (firings, output)
    assert sum(firings[slot] == BEATS for slot in inner) >= len(inner) - 1, (firings, output)
    assert all(runs[slot] == 1 for slot in inner), (runs, firings, output)
    assert all(count <= 1 for count in runs.values()), (runs, output)
    pids = {json.loads(line)["pid"] for line in history.read_text().splitlines()}
    assert len(pids) >= 2, pids  # the messages were spread over several worker children
