"""Each alias' health: one round trip per alias, its latency or why it failed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .checks import AUDIT_APP, audit_app_missing
from .exceptions import BackendUnavailable, DistLockError, LockConfigurationError
from .handler import locks

__all__ = ["Health", "check_health", "extra_probes", "health_view", "probe"]


@dataclass(frozen=True, slots=True)
class Health:
    alias: str
    ok: bool
    latency: float | None
    error: str = ""

    @property
    def latency_ms(self) -> float | None:
        """The latency in milliseconds (3 decimals), as every report shows it."""
        return None if self.latency is None else round(self.latency * 1000, 3)


#: More checks of an alias' health, each called with the alias after its backend
#: answered and raising a :class:`DistLockError` when it fails; an app adds its own in
#: its ``ready()`` (the audit app checks that an auditing alias' table can be written).
extra_probes: list[Callable[[str], None]] = []


def probe(alias: str) -> float:
    """Return the latency of ``alias``' ``health()``, after the :data:`extra_probes`.

    :raises DistLockError: when the backend, or an extra probe, fails.
    :raises LockConfigurationError: when the alias is misconfigured.
    """
    latency = locks[alias].health()
    if audit_app_missing(locks.settings.get(alias)):
        raise BackendUnavailable(
            f"Lock alias {alias!r} has AUDIT, whose events the audit app writes: add "
            f"{AUDIT_APP!r} to INSTALLED_APPS and run `manage.py migrate distlock_audit`."
        )
    for check in extra_probes:
        check(alias)
    return latency


def check_health(aliases: list[str] | None = None) -> list[Health]:
    """Return the health of ``aliases`` (default: all), each from :func:`probe`."""
    found = []
    for alias in aliases if aliases is not None else list(locks):
        try:
            latency = probe(alias)
        except (DistLockError, LockConfigurationError) as exc:
            found.append(Health(alias, False, None, f"{type(exc).__name__}: {exc}"))
        else:
            found.append(Health(alias, True, latency))
    return found


@never_cache
@require_GET
def health_view(request: HttpRequest) -> JsonResponse:
    """JSON for load balancers: ``{"ok": bool, "aliases": {alias: {"ok", "latency_ms",
    "error"}}}``, 200 when every alias answers, else 503. Errors name only the
    exception class (the message may name hosts)."""
    results = check_health()
    body = {
        "ok": all(h.ok for h in results),
        "aliases": {
            h.alias: {
                "ok": h.ok,
                "latency_ms": h.latency_ms,
                "error": h.error.split(":", 1)[0],
            }
            for h in results
        },
    }
    return JsonResponse(body, status=200 if body["ok"] else 503)
