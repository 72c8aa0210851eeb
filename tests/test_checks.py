"""System checks of the DISTLOCK setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import checks
from django.test import override_settings

from django_distlock.checks import check_distlock

pytestmark = pytest.mark.django_versions

_MODULE = check_distlock.__module__

DB = "django_distlock.backends.database.DatabaseBackend"


def ids(**overrides) -> list[str]:
    with override_settings(**overrides):
        return [message.id for message in check_distlock()]


def test_valid_settings_pass() -> None:
    assert ids() == []
    assert ids(DISTLOCK=None) == []  # the default: database backend, default database


def test_missing_default() -> None:
    assert ids(DISTLOCK={"other": {"BACKEND": DB}}) == ["distlock.E001"]


@pytest.mark.parametrize("path", ["nope.Backend", "django_distlock.backends.database.Nope",
                                  "django.core.cache.backends.locmem.LocMemCache"])
def test_backend_that_will_not_import(path: str) -> None:
    assert ids(DISTLOCK={"default": {"BACKEND": path}}) == ["distlock.E002"]


@pytest.mark.parametrize(
    "params",
    [
        {"BACKEND": DB, "OPTIONS": {"MODE": "optimistic"}},
        {"BACKEND": DB, "OPTIONS": {"PREPARE": "yes"}},
        {"BACKEND": DB, "OPTIONS": {"DATABSE": "default"}},
        {"BACKEND": DB, "OPTIONS": {"DATABASE": "missing"}},
        {"BACKEND": DB, "TTL": 0},
        {"BACKEND": DB, "TIMEOUT": -1},
        {"BACKEND": DB, "KEY_PREFIX": "bad\x00"},
        {"BACKEND": DB, "TIMOUT": 3},
        {"BACKEND": DB, "OPTIONS": "default"},
        {},
    ],
)
def test_unusable_options(params) -> None:
    assert ids(DISTLOCK={"default": params}) == ["distlock.E003"]


def test_malformed_setting() -> None:
    assert ids(DISTLOCK=["default"]) == ["distlock.E003"]


def test_database_it_cannot_serve() -> None:
    setting = {"default": {"BACKEND": DB, "OPTIONS": {"DATABASE": "unsupported"}}}
    assert ids(DISTLOCK=setting) == ["distlock.E004"]


def test_app_not_installed() -> None:
    apps = ["django.contrib.auth", "django.contrib.contenttypes"]
    assert set(ids(INSTALLED_APPS=apps)) == {"distlock.E005"}


def test_app_not_installed_is_reported_by_manage_py_check() -> None:
    """The checks run although the app (whose ``ready()`` used to register them) is not
    installed: a site whose code imports the package hears of E005 at startup, not at
    its first acquire."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--settings", "tests.settings_without_app"],
        cwd=root, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "distlock.E005" in done.stderr
    assert done.stderr.count("distlock.E005") == 1  # registered once


def test_checks_are_registered_once() -> None:
    registered = [c for c in checks.registry.registry.get_checks() if c.__module__ == _MODULE]
    assert len(registered) == 1


def test_deploy_check_warns_about_the_process_local_backend() -> None:
    messages = checks.run_checks(include_deployment_checks=True, tags=["distlock"])
    assert [m.id for m in messages if m.obj == "locmem"] == ["distlock.W002"]
    assert not [m for m in checks.run_checks(tags=["distlock"]) if m.obj == "locmem"]


def test_an_alias_that_audits_without_the_audit_app() -> None:
    audited = {"default": {"BACKEND": DB, "AUDIT": True}}
    assert ids(DISTLOCK=audited) == []  # the test settings install the audit app
    apps = ["django.contrib.auth", "django.contrib.contenttypes", "django_distlock"]
    assert ids(DISTLOCK=audited, INSTALLED_APPS=apps) == ["distlock.E006"]
    assert ids(DISTLOCK={"default": {"BACKEND": DB, "AUDIT": False}}, INSTALLED_APPS=apps) == []


@pytest.mark.parametrize("value", ["yes", {"SAMPLE": 2}, {"RETENTION_DAYS": 0}, {"KEEP": 1}])
def test_an_unusable_audit_is_the_audit_apps_check(value: object) -> None:
    from django_distlock.contrib.audit.checks import check_audit

    setting = {"default": {"BACKEND": DB, "AUDIT": value}}
    assert ids(DISTLOCK=setting) == []  # the core reserves the key and reads nothing of it
    with override_settings(DISTLOCK=setting):
        assert [(m.id, m.obj) for m in check_audit()] == [("distlock.E003", "default")]


def test_a_site_with_the_core_only_migrates_no_audit_table(tmp_path: Path) -> None:
    """The audit trail's tables come with its app: a Redis-only site without it has the
    core's lock tables (the database backend's, empty) and nothing else of ours."""
    root = Path(__file__).resolve().parent.parent
    database = tmp_path / "core.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(root), "DISTLOCK_CORE_ONLY_DB": str(database)}
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--settings", "tests.settings_core_only"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    import sqlite3

    with sqlite3.connect(database) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master"
                                                        " WHERE type = 'table'")}
    ours = {name for name in tables if name.startswith("django_distlock")}
    assert ours == {"django_distlock_lock", "django_distlock_share"}
