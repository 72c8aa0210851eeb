"""System checks of the ``DISTLOCK`` setting (ids ``distlock.E001`` ...) and of the
scheduled jobs (``schedules.py``).

This module only loops over the aliases; each backend's own ``check()``
holds the checks of its options.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .handler import DEFAULT_LOCK_ALIAS, LockHandler, locks
from .schedules import check_jobs


@checks.register("distlock")
def check_distlock(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Build every alias' backend (no I/O) and gather its messages, then those of the
    jobs decorated with ``once_per_slot`` (``distlock.E040``, ``distlock.W040``)."""
    return _gather(deploy=False) + check_jobs()


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
    if DEFAULT_LOCK_ALIAS not in aliases and not deploy:
        messages.append(
            checks.Error(
                f"DISTLOCK has no {DEFAULT_LOCK_ALIAS!r} alias.",
                hint="Add one; decorators and lock() use it unless given using=.",
                id="distlock.E001",
            )
        )
    for alias in aliases:
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
