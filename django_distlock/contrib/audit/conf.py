"""The ``AUDIT`` key of an alias: whether and how its lock events go to the audit trail.

The core reserves the key (a backend accepts it and ignores it); this app reads it
through the registry's settings (:attr:`locks.settings <django_distlock.handler.
LockHandler.settings>`), once per alias, and forgets what it read when ``DISTLOCK``
changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.signals import setting_changed

from django_distlock.exceptions import InvalidBackendOptions, LockConfigurationError
from django_distlock.handler import locks


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """An alias' audit settings (``AUDIT`` is True, or a dict of these keys)."""

    #: Fraction of the holds recorded (each a row, written at its release or loss), 0 to 1.
    sample: float = 1.0
    #: Days a purge keeps (None: all). Only a scheduled purge deletes: ``manage.py
    #: distlock_audit purge`` under cron, or the Celery task ``purge_audit`` under beat.
    retention_days: float | None = 30.0


def parse_audit(alias: str, raw: Any) -> AuditSettings | None:
    """Return the audit settings of ``DISTLOCK[alias]['AUDIT']``; None when off (absent/False).

    :raises InvalidBackendOptions: when the value is unusable.
    """
    if raw is None or raw is False:
        return None
    if raw is True:
        return AuditSettings()
    where = f"DISTLOCK[{alias!r}]['AUDIT']"
    if not isinstance(raw, dict):
        raise InvalidBackendOptions(f"{where} must be True, False or a dict.")
    unknown = set(raw) - {"SAMPLE", "RETENTION_DAYS"}
    if unknown:
        raise InvalidBackendOptions(f"{where} has unknown keys {sorted(unknown)}.")
    sample = raw.get("SAMPLE", 1.0)
    if isinstance(sample, bool) or not isinstance(sample, int | float) or not 0 <= sample <= 1:
        raise InvalidBackendOptions(f"{where}['SAMPLE'] must be a number from 0 to 1.")
    days = raw.get("RETENTION_DAYS", 30.0)
    if days is not None and (
        isinstance(days, bool)
        or not isinstance(days, int | float)
        or not math.isfinite(days)
        or days <= 0
    ):
        raise InvalidBackendOptions(f"{where}['RETENTION_DAYS'] must be a positive number or None.")
    return AuditSettings(float(sample), None if days is None else float(days))


_read: dict[str, AuditSettings | None] = {}


def audit_for(alias: str) -> AuditSettings | None:
    """Return the audit settings of ``alias`` (None: it does not audit, or it is not
    configured), parsed once per alias until ``DISTLOCK`` changes.

    :raises InvalidBackendOptions: when its ``AUDIT`` is unusable.
    """
    try:
        return _read[alias]
    except KeyError:
        pass
    params = locks.settings.get(alias)
    found = parse_audit(alias, params.get("AUDIT")) if isinstance(params, Mapping) else None
    _read[alias] = found
    return found


def audited_aliases() -> list[str]:
    """The aliases of ``DISTLOCK`` whose ``AUDIT`` is on (read as they are: a malformed
    value is the system checks' to report)."""
    try:
        aliases = locks.settings
    except LockConfigurationError:
        return []
    return [
        alias
        for alias, params in aliases.items()
        if isinstance(params, Mapping) and params.get("AUDIT") not in (None, False)
    ]


def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting == "DISTLOCK":
        _read.clear()


setting_changed.connect(_forget, dispatch_uid="django_distlock.contrib.audit.conf")
