"""The audit trail's receivers are connected only while an alias audits: with none, a
lock event calls no audit receiver; ``override_settings`` of ``DISTLOCK`` connects and
disconnects them."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_distlock import locks, signals
from django_distlock.contrib.audit import recorder as recorder_module
from django_distlock.contrib.audit.models import LockEvent
from django_distlock.contrib.audit.recorder import follow_audit, recorder

pytestmark = [pytest.mark.django_versions, pytest.mark.django_db(transaction=True)]

LOCMEM = "django_distlock.backends.locmem.LocMemBackend"
QUIET = {"default": {"BACKEND": LOCMEM}}
AUDITED = {"default": {"BACKEND": LOCMEM}, "audited": {"BACKEND": LOCMEM, "AUDIT": True}}
SIGNALS = (
    signals.lock_acquired,
    signals.lock_not_acquired,
    signals.lock_released,
    signals.lock_lost,
    signals.lock_force_released,
)


def audit_receivers() -> list[Any]:
    """The signals the audit receivers are connected to now (from Django's own
    receiver list, by their dispatch_uid)."""
    return [
        signal
        for signal in SIGNALS
        if any(entry[0][0] == recorder_module._uid(signal) for entry in signal.receivers)
    ]


def events(alias: str) -> int:
    recorder.flush()
    return LockEvent.objects.filter(alias=alias).count()


def test_the_test_settings_audit_nothing_and_connect_nothing() -> None:
    assert not any("AUDIT" in params for params in settings.DISTLOCK.values())
    assert audit_receivers() == []
    assert follow_audit() is False


def test_no_alias_audits_no_receiver_is_connected() -> None:
    with override_settings(DISTLOCK=QUIET):
        assert audit_receivers() == []
        with locks["default"].lock("quiet:n", ttl=10):
            pass
        assert audit_receivers() == []
    assert events("default") == 0


def test_override_settings_connects_and_disconnects() -> None:
    with override_settings(DISTLOCK=AUDITED):
        assert audit_receivers() == list(SIGNALS)
        with locks["audited"].lock("audited:a", ttl=10):
            pass
        assert events("audited") == 1  # the hold, at its release
        with override_settings(DISTLOCK=QUIET):
            assert audit_receivers() == []
        assert audit_receivers() == list(SIGNALS)  # back to AUDITED
        with locks["audited"].lock("audited:b", ttl=10):
            pass
        assert events("audited") == 2
        with locks["default"].lock("default:c", ttl=10):  # connected, this alias not audited
            pass
        assert events("default") == 0
    assert audit_receivers() == []


