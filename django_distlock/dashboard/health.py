"""Each alias' health: one round trip per alias, its latency or why it failed."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ..exceptions import DistLockError, LockConfigurationError
from ..handler import locks


@dataclass(frozen=True, slots=True)
class Health:
    alias: str
    ok: bool
    latency: float | None
    error: str = ""


def check_health(aliases: list[str] | None = None) -> list[Health]:
    """Return the health of ``aliases`` (default: all), each from its backend's ``health()``."""
    found = []
    for alias in aliases if aliases is not None else list(locks):
        try:
            latency = locks[alias].health()
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
                "latency_ms": None if h.latency is None else round(h.latency * 1000, 3),
                "error": h.error.split(":", 1)[0],
            }
            for h in results
        },
    }
    return JsonResponse(body, status=200 if body["ok"] else 503)
