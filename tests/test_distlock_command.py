"""``manage.py distlock`` and the JSON health view, with real locks held."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.utils import timezone

from django_distlock import holder_context, locks
from django_distlock.contrib.audit.models import LockEvent
from django_distlock.exceptions import LockLost
from django_distlock.health import check_health

from .conftest import DATABASES, LIBRARY_DB, require_pg
from .tables import table_missing

pytestmark = [
    pytest.mark.django_versions,
    LIBRARY_DB,
]

DOWN = {
    "BACKEND": "django_distlock.backends.redis.RedisBackend",
    "LOCATION": "redis://127.0.0.1:1/0",
}


#: The tests that request a page through the test client: its middleware (sessions,
#: auth) needs Django's own apps, which LIBRARY_DB leaves out of the registry. Run alone,
#: the module failed on them (auth's middleware imported for the first time there).
WITH_DJANGOS_APPS = pytest.mark.django_db(transaction=True, databases=DATABASES)


def run(*args: str, **kwargs: Any) -> str:
    out = StringIO()
    command = "distlock_audit" if args[:1] == ("purge",) else "distlock"
    call_command(command, *args, stdout=out, stderr=StringIO(), **kwargs)
    return out.getvalue()


def test_list_json_over_aliases_with_filters() -> None:
    handles = [locks[a].lock(f"cmd:{a}", ttl=60) for a in ("default", "locmem")]
    for handle in handles:
        handle.acquire()
    found = json.loads(run("list", "--prefix", "cmd:", "--json"))
    assert {(i["alias"], i["name"]) for i in found["locks"]} >= {
        ("default", "cmd:default"),
        ("locmem", "cmd:locmem"),
    }
    assert all(len(i["owner"]) == 8 for i in found["locks"])
    only = json.loads(run("list", "--alias", "locmem", "--prefix", "cmd:", "--json"))
    assert [i["alias"] for i in only["locks"]] == ["locmem"]
    assert len(json.loads(run("list", "--prefix", "cmd:", "--limit", "1", "--json"))["locks"]) == 1
    for handle in handles:
        handle.release()


@pytest.mark.parametrize(
    "args", [("list", "--alias", "nope"), ("list", "--prefix", "a\x00"), ("inspect", "nope", "x")]
)
def test_bad_arguments_are_command_errors(args: tuple[str, ...]) -> None:
    with pytest.raises(CommandError):
        run(*args)


def test_inspect_and_release_with_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    handle = locks["default"].lock("cmd:x", ttl=60)
    with holder_context("GET /orders/7/pay"):
        handle.acquire()
    assert json.loads(run("inspect", "default", "cmd:x", "--json"))["owner"] == handle.owner_id
    prompts: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt: prompts.append(prompt) or "n")
    with pytest.raises(CommandError, match="Not released"):
        run("release", "default", "cmd:x", "--reason", "test")
    assert "(GET /orders/7/pay)" in prompts[0]  # what the holder is doing, as listed
    assert locks["default"].is_locked("cmd:x")
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert "Released" in run("release", "default", "cmd:x", "--reason", "stuck")
    assert not locks["default"].is_locked("cmd:x")
    event = LockEvent.objects.get()
    assert event.actor.startswith("command:") and event.reason == "stuck"
    with pytest.raises(CommandError, match="not held"):
        run("release", "default", "cmd:x", "--reason", "again", "--yes")


def test_purge_keeps_what_is_recent() -> None:
    now = timezone.now()
    for age in (1, 40):
        LockEvent.objects.create(
            at=now - timedelta(days=age), kind="acquired", alias="default", name="n"
        )
    assert "Deleted 1 audit rows." in run("purge")
    assert LockEvent.objects.exclude(kind="purged").count() == 1  # the purge is recorded
    assert "Deleted 1 audit rows." in run("purge", "--days", "0")
    assert set(LockEvent.objects.values_list("kind", flat=True)) == {"purged"}


@WITH_DJANGOS_APPS
def test_health_exit_status_and_view(settings: Any) -> None:
    assert "default\tok" in run("health")
    body = Client().get("/distlock/health/")
    assert body.status_code == 200 and body.json()["aliases"]["locmem"]["ok"]
    with override_settings(DISTLOCK={**settings.DISTLOCK, "down": DOWN}):
        with pytest.raises(CommandError) as failed:
            run("health")
        assert failed.value.returncode == 1
        body = Client().get("/distlock/health/")
        assert body.status_code == 503
        down = body.json()["aliases"]["down"]
        assert down == {"ok": False, "latency_ms": None, "error": "BackendUnavailable"}
        assert body.json()["aliases"]["default"]["ok"]


def test_release_without_yes_and_no_terminal_is_a_command_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """stdin at its end (cron, CI, ``< /dev/null``): a clear error, not an EOFError."""
    handle = locks["default"].lock("cmd:notty", ttl=60)
    handle.acquire()
    try:
        with open(os.devnull) as devnull:
            monkeypatch.setattr("sys.stdin", devnull)
            with pytest.raises(CommandError, match="--yes"):
                run("release", "default", "cmd:notty", "--reason", "stuck")
        assert locks["default"].is_locked("cmd:notty")
        assert not LockEvent.objects.exists()
    finally:
        with contextlib.suppress(LockLost):
            handle.release()


@pytest.mark.parametrize("days", ["nan", "inf", "-inf", "-1", "1e12"])
def test_purge_refuses_days_that_are_not_a_usable_number(days: str) -> None:
    LockEvent.objects.create(at=timezone.now(), kind="acquired", alias="default", name="n")
    with pytest.raises(CommandError, match="--days"):
        run("purge", "--days", days)
    assert LockEvent.objects.count() == 1


@pytest.mark.parametrize("reason", ["", "   ", "x" * 2001])
def test_release_needs_a_reason_like_the_admin(reason: str) -> None:
    handle = locks["default"].lock("cmd:reason", ttl=60)
    handle.acquire()
    try:
        with pytest.raises(CommandError, match="--reason"):
            run("release", "default", "cmd:reason", "--reason", reason, "--yes")
        assert locks["default"].is_locked("cmd:reason")
        assert not LockEvent.objects.exists()
    finally:
        with contextlib.suppress(LockLost):
            handle.release()


def test_health_fails_on_a_database_that_was_never_migrated(tmp_path: Path) -> None:
    """Every acquire there fails, and the audit trail cannot be written: health says so."""
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "DISTLOCK_SQLITE_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "tests.settings_unmigrated",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "distlock", "health", "--json"],
        cwd=root, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    found = json.loads(done.stdout)
    assert not found["default"]["ok"] and "migrate" in found["default"]["error"]
    assert not found["audited"]["ok"] and "audit" in found["audited"]["error"]
    assert found["quiet"]["ok"] and found["quiet"]["latency_ms"] >= 0  # the view's unit
    assert found["default"]["latency_ms"] is None


@WITH_DJANGOS_APPS
@pytest.mark.parametrize("table", ["django_distlock_lock", LockEvent._meta.db_table])
def test_health_command_and_view_fail_without_the_tables(settings: Any, table: str) -> None:
    """The lock table gone (PostgreSQL: every mode), or the audit table gone under an
    alias that audits."""
    require_pg()
    audited = {"BACKEND": "django_distlock.backends.locmem.LocMemBackend", "AUDIT": True}
    with override_settings(DISTLOCK={**settings.DISTLOCK, "audited": audited}):
        assert "pg-tx\tok" in run("health") and "audited\tok" in run("health")
        failing = (["pg-lease", "pg-tx", "pg-session"] if table == "django_distlock_lock"
                   else ["audited"])
        database = "pg" if table == "django_distlock_lock" else "default"
        with table_missing(database, table):
            with pytest.raises(CommandError) as failed:
                run("health")
            assert failed.value.returncode == 1
            body = Client().get("/distlock/health/")
            assert body.status_code == 503
            states = body.json()["aliases"]
            assert [a for a, s in states.items() if not s["ok"]] == failing
        assert Client().get("/distlock/health/").status_code == 200


def test_health_of_an_audited_alias_without_the_app_says_to_add_it() -> None:
    audited = {"BACKEND": "django_distlock.backends.locmem.LocMemBackend", "AUDIT": True}
    apps = ["django.contrib.auth", "django.contrib.contenttypes"]
    with override_settings(DISTLOCK={"default": audited}, INSTALLED_APPS=apps):
        (found,) = check_health()
    assert not found.ok and "INSTALLED_APPS" in found.error


BROKEN_ALIAS_SETTINGS = """
from tests.settings import *  # noqa: F403

DISTLOCK = {
    "default": {"BACKEND": "django_distlock.backends.locmem.LocMemBackend"},
    "broken": {
        "BACKEND": "django_distlock.backends.redis.RedisBackend",
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {"NO_SUCH_OPTION": 1},
    },
}
"""


def _distlock_with_settings(
    tmp_path: Path, settings_text: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """``manage.py distlock *args`` in a subprocess, under the settings module ``text``."""
    (tmp_path / "command_settings.py").write_text(settings_text)
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(tmp_path)]),
        "DISTLOCK_SQLITE_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "command_settings",
    }
    return subprocess.run(
        [sys.executable, "manage.py", "distlock", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("args", "returncode", "out"),
    [
        (("health",), 1, "default\tok"),
        (("list", "--alias", "default"), 0, ""),
        (("list",), 2, ""),
        (("inspect", "default", "nothing-held"), 3, ""),
        (("inspect", "broken", "x"), 1, ""),
    ],
)
def test_one_misconfigured_alias_blocks_no_subcommand(
    tmp_path: Path, args: tuple[str, ...], returncode: int, out: str
) -> None:
    """The system checks' error about one alias only warns in this command: the other
    aliases are listed and probed, the bad one is reported by name."""
    done = _distlock_with_settings(tmp_path, BROKEN_ALIAS_SETTINGS, *args)
    assert done.returncode == returncode, done.stdout + done.stderr
    assert "SystemCheckError" not in done.stderr
    assert "broken: misconfigured" in done.stderr and "NO_SUCH_OPTION" in done.stderr
    assert out in done.stdout


def test_other_check_errors_still_stop_the_command(tmp_path: Path) -> None:
    """Only alias-scoped errors are relaxed: a DISTLOCK without a default alias (not one
    alias' error) still fails the checks."""
    no_default = BROKEN_ALIAS_SETTINGS.replace('"default"', '"other"')
    done = _distlock_with_settings(tmp_path, no_default, "health")
    assert done.returncode == 1 and "SystemCheckError" in done.stderr, done.stderr
    assert "distlock.E001" in done.stderr


def test_singleton_refuses_what_it_cannot_run_before_campaigning() -> None:
    """``distlock singleton``: a missing command, an unknown alias, a backend that cannot
    lead, a grace that does not fit in the term: each a clear error, nothing held.
    (Runners at work: tests/test_singleton_processes.py.)"""
    with pytest.raises(CommandError, match="needs a command"):
        run("singleton", "beat", "--using", "locmem")
    with pytest.raises(CommandError, match="No lock alias 'nowhere'"):
        run("singleton", "beat", "true", "--using", "nowhere")
    with pytest.raises(CommandError, match="cannot hold a leadership term"):
        run("singleton", "beat", "true", "--using", "sqlite-tx")
    with pytest.raises(CommandError, match="must fit in"):
        run("singleton", "beat", "true", "--using", "locmem", "--ttl", "3", "--grace", "1")
    assert not locks["locmem"].is_locked("leader:beat")
