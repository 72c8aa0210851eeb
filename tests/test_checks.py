"""System checks of the DISTLOCK setting."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_distlock.checks import check_distlock

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
