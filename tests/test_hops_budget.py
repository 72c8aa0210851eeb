"""The hot path's budget: a warm acquire and release per backend make no more package
calls, nest no deeper and send no more than ``benchmarks/hops_budget.json`` records
(``python -m benchmarks.hops --check``). A change that needs more records the new
figures on purpose (``--record``) and says why in its commit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import FULL_RUN

ROOT = Path(__file__).resolve().parent.parent
BUDGET = ROOT / "benchmarks" / "hops_budget.json"


def _hops(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run([sys.executable, "-m", "benchmarks.hops", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def _measured(stdout: str) -> set[str]:
    cells = {line.split("|")[1].strip() for line in stdout.splitlines() if line.startswith("| ")}
    return cells - {"alias", "---"}


def test_a_warm_acquire_and_release_stay_within_the_budget() -> None:
    run = _hops("--check")
    assert run.returncode == 0, run.stdout + run.stderr
    if FULL_RUN:  # every server of the run: every alias of the budget was measured
        assert _measured(run.stdout) == set(json.loads(BUDGET.read_text()))


def test_one_call_more_than_the_budget_fails(tmp_path: Path) -> None:
    budget = json.loads(BUDGET.read_text())
    budget["locmem"]["acquire"]["calls"] -= 1  # as if the acquire had grown by one call
    tight = tmp_path / "budget.json"
    tight.write_text(json.dumps(budget))
    run = _hops("--check", "--budget", str(tight))
    assert run.returncode == 1
    assert f"OVER BUDGET: locmem acquire: {budget['locmem']['acquire']['calls'] + 1} calls" in (
        run.stdout)
