"""System checks of the ``DISTLOCK`` setting (ids ``distlock.E001`` ...). The contrib
apps register their own (the audit app its ``AUDIT`` key, the schedules app its jobs).

This module only loops over the aliases; each backend's own ``check()``
holds the checks of its options.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .handler import DEFAULT_LOCK_ALIAS, LockHandler, locks

#: The app that reads an alias' ``AUDIT`` (the core only reserves the key).
AUDIT_APP = "django_distlock.contrib.audit"


def audit_app_missing(params: Any) -> bool:
    """Whether an alias' settings ask for the audit trail that no installed app keeps."""
    audits = isinstance(params, Mapping) and params.get("AUDIT") not in (None, False)
    return audits and not apps.is_installed(AUDIT_APP)


@checks.register("distlock")
def check_distlock(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Build every alias' backend (no I/O) and gather its messages."""
    return _gather(deploy=False)


@checks.register("distlock", deploy=True)
def check_distlock_deploy(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy``: each backend's deployment messages."""
    return _gather(deploy=True)


def _gather(deploy: bool) -> list[checks.CheckMessage]:
    try:
        aliases = LockHandler.configure(getattr(settings, "DISTLOCK", None))
    except ImproperlyConfigured as exc:
        return [] if deploy else [checks.Error(str(exc), id="distlock.E003")]
    messages: list[checks.CheckMessage] = []
    if not deploy:
        try:
            LockHandler.check_order()
        except ImproperlyConfigured as exc:
            messages.append(checks.Error(str(exc), id="distlock.E007"))
    if DEFAULT_LOCK_ALIAS not in aliases and not deploy:
        messages.append(
            checks.Error(
                f"DISTLOCK has no {DEFAULT_LOCK_ALIAS!r} alias.",
                hint="Add one; decorators and lock() use it unless given using=.",
                id="distlock.E001",
            )
        )
    for alias, params in aliases.items():
        if not deploy and audit_app_missing(params):
            messages.append(
                checks.Error(
                    f"DISTLOCK[{alias!r}] has AUDIT, which the audit app reads.",
                    hint=f"Add {AUDIT_APP!r} to INSTALLED_APPS and run "
                    "`manage.py migrate distlock_audit`, or remove AUDIT.",
                    obj=alias,
                    id="distlock.E006",
                )
            )
        try:
            backend = locks.create_backend(alias)
        except ImproperlyConfigured as exc:
            if deploy:
                continue
            cause = exc.__cause__
            import_failed = isinstance(cause, ImportError) or "BaseLockBackend" in str(exc)
            check_id = "distlock.E002" if import_failed else "distlock.E003"
            check_id = getattr(exc, "check_id", check_id)  # an option's own id (E012)
            messages.append(checks.Error(str(exc), obj=alias, id=check_id))
            continue
        messages.extend(backend.check(deploy=deploy))
    return messages
