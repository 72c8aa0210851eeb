"""The ``locks`` registry."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_distlock import locks
from django_distlock.backends.database import DatabaseBackend
from django_distlock.exceptions import InvalidLockAlias, LockConfigurationError

pytestmark = pytest.mark.django_versions

DB = "django_distlock.backends.database.DatabaseBackend"


def test_default_without_setting_is_the_database_backend() -> None:
    with override_settings(DISTLOCK=None):
        backend = locks["default"]
        assert isinstance(backend, DatabaseBackend)
        assert backend.database == "default" and backend.mode == "lease"
        assert list(locks) == ["default"]


def test_built_lazily_once_per_process_and_shared_by_threads() -> None:
    with override_settings(DISTLOCK={"default": {"BACKEND": DB}, "b": {"BACKEND": DB}}):
        assert locks.all(initialized_only=True) == []
        first = locks["b"]
        seen = []
        thread = threading.Thread(target=lambda: seen.append(locks["b"]))
        thread.start()
        thread.join()
        assert seen == [first] and locks["b"] is first
        assert locks.all(initialized_only=True) == [first]


def test_rebuilt_when_setting_changes() -> None:
    before = locks["default"]
    with override_settings(DISTLOCK={"default": {"BACKEND": DB, "TTL": 7}}):
        assert locks["default"] is not before
        assert locks["default"].default_ttl == 7
    assert locks["default"].default_ttl == 30


def test_unknown_alias() -> None:
    with pytest.raises(InvalidLockAlias, match="'nope' is not configured") as info:
        locks["nope"]
    assert isinstance(info.value, KeyError) and isinstance(info.value, ImproperlyConfigured)
    with pytest.raises(InvalidLockAlias):
        locks[3]  # type: ignore[index]


def test_bad_backend_is_a_configuration_error() -> None:
    with (
        override_settings(DISTLOCK={"default": {"BACKEND": "no.such.Backend"}}),
        pytest.raises(LockConfigurationError, match="could not be imported"),
    ):
        locks["default"]


def _child_identity(out) -> None:
    out.put(id(locks["default"]))


def test_forked_child_builds_its_own() -> None:
    parent = locks["default"]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_child_identity, args=(out,))
    proc.start()
    child_id = out.get(timeout=30)
    proc.join(10)
    assert child_id != id(parent)
