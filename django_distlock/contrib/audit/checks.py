"""System checks of the ``AUDIT`` key of each ``DISTLOCK`` alias (``distlock.E003``,
the id a malformed alias option has)."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_distlock.handler import LockHandler

from .conf import parse_audit


@checks.register("distlock")
def check_audit(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Parse every alias' ``AUDIT``; report the unusable ones."""
    from django.conf import settings

    try:
        aliases = LockHandler.configure(getattr(settings, "DISTLOCK", None))
    except ImproperlyConfigured:
        return []  # the core's check reports it
    messages: list[checks.CheckMessage] = []
    for alias, params in aliases.items():
        try:
            parse_audit(alias, params.get("AUDIT"))
        except ImproperlyConfigured as exc:
            messages.append(checks.Error(str(exc), obj=alias, id="distlock.E003"))
    return messages
