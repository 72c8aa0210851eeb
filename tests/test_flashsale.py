"""``manage.py flashsale`` run for real: worker processes, a real database, its table.

Each test runs the command in a subprocess with ``testproject.settings`` (the
suite's own settings are not involved), on a fresh SQLite file or on a
PostgreSQL database of its own, and reads the table it prints: every locking
strategy must have sold exactly the stock and oversold nothing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import require_pg

pytestmark = pytest.mark.django_versions

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 4
STOCK = 20
#: The PostgreSQL database the flash sale runs in (created when missing).
PG_DATABASE = "distlock_flashsale"
#: Strategies the testproject always has; aliases added later show up as more rows.
ALWAYS = (
    "no lock",
    "database lease (default)",
    "database transaction (db-tx)",
    "optimistic (version column, retry)",
    "fenced writes, database lease (default)",
)
#: Strategies that take no lock, so have no lock wait to show.
LOCKLESS = ("no lock", "optimistic (version column, retry)")


@dataclass
class Row:
    """One strategy's row of the table."""

    label: str
    cells: dict[str, str]
    skipped: str | None = None


def _servers_run() -> bool:
    """Whether the servers were started by scripts/test, so none may be missing."""
    return os.environ.get("DISTLOCK_SERVERS") == "1"


def _env(**overrides: str) -> dict[str, str]:
    """The subprocess environment: the caller's, minus any database choice, plus ``overrides``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DISTLOCK_PG_", "DISTLOCK_SQLITE_", "DISTLOCK_MYSQL_",
                               "DISTLOCK_DEMO_"))
        and key != "DJANGO_SETTINGS_MODULE"
    }
    env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    env.update(overrides)
    return env


def _flashsale(env: dict[str, str]) -> tuple[str, dict[str, Row]]:
    """Run the command; return its stdout and its table's rows, by strategy label."""
    command = [
        sys.executable,
        "manage.py",
        "flashsale",
        "--workers",
        str(WORKERS),
        "--stock",
        str(STOCK),
        "--no-progress",
    ]
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    output = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, f"flashsale exited with {proc.returncode}\n{output}"
    return proc.stdout, _parse_table(proc.stdout)


def _parse_table(stdout: str) -> dict[str, Row]:
    lines = stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("strategy ")), None)
    assert start is not None, f"no table in the output:\n{stdout}"
    columns = [cell.strip() for cell in lines[start].split("|")]
    rows: dict[str, Row] = {}
    for line in lines[start + 2 :]:
        if "|" not in line:
            break
        label, rest = (part.strip() for part in line.split("|", 1))
        if rest.startswith("skipped:"):
            rows[label] = Row(label, {}, rest.removeprefix("skipped:").strip())
            continue
        cells = [label, *(cell.strip() for cell in rest.split("|"))]
        assert len(cells) == len(columns), f"malformed row {line!r}"
        rows[label] = Row(label, dict(zip(columns, cells, strict=True)))
    return rows


def _check(stdout: str, rows: dict[str, Row]) -> None:
    for label in ALWAYS:
        assert label in rows, f"the table does not name {label!r}:\n{stdout}"
    skipped = {row.label: row.skipped for row in rows.values() if row.skipped}
    if skipped and _servers_run():
        pytest.fail(f"strategies skipped although scripts/test started the servers: {skipped}")
    for row in rows.values():
        if row.skipped:
            continue
        sold = int(row.cells["units sold"])
        if row.label == "no lock":
            assert sold >= STOCK, stdout  # it may oversell; it never undersells
            continue
        assert row.cells["oversold"] == "0", f"{row.label} oversold:\n{stdout}"
        assert sold == STOCK, f"{row.label} sold {sold} of {STOCK}:\n{stdout}"
        waited = row.cells["lock wait p50 (ms)"]
        assert (waited == "-") is (row.label in LOCKLESS), stdout
        assert float(row.cells["purchases/s"]) > 0, stdout
    assert "Verdict: PASS" in stdout, stdout


def test_flashsale_on_sqlite(tmp_path: Path) -> None:
    env = _env(DISTLOCK_SQLITE_PATH=str(tmp_path / "flashsale.sqlite3"))
    stdout, rows = _flashsale(env)
    assert "database sqlite (" in stdout, stdout
    _check(stdout, rows)


def _create_database(name: str) -> None:
    """Create the PostgreSQL database ``name`` if it does not exist."""
    import psycopg
    from psycopg import errors, sql

    with psycopg.connect(
        host=os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
        port=os.environ["DISTLOCK_PG_PORT"],
        user=os.environ.get("DISTLOCK_PG_USER", "postgres"),
        dbname="postgres",
        autocommit=True,
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            # A concurrent run may create it meanwhile.
            with contextlib.suppress(errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@pytest.mark.servers
def test_flashsale_on_postgresql() -> None:
    require_pg()  # fails when scripts/test started the servers and PostgreSQL is missing
    _create_database(PG_DATABASE)
    env = _env(
        DISTLOCK_PG_HOST=os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
        DISTLOCK_PG_PORT=os.environ["DISTLOCK_PG_PORT"],
        DISTLOCK_PG_USER=os.environ.get("DISTLOCK_PG_USER", "postgres"),
        DISTLOCK_PG_NAME=PG_DATABASE,
    )
    stdout, rows = _flashsale(env)
    assert f"database postgresql ({PG_DATABASE})" in stdout, stdout
    _check(stdout, rows)
