"""Each alias' health: one round trip per alias, its latency or why it failed."""

from __future__ import annotations

from dataclasses import dataclass

from django.apps import apps
from django.db import DatabaseError, connections, router, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ..exceptions import BackendUnavailable, DistLockError, LockConfigurationError
from ..handler import locks


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


def probe(alias: str) -> float:
    """Return the latency of ``alias``' ``health()``; when the alias audits, also check
    that the audit trail's table can be read (its events would be dropped otherwise).

    :raises DistLockError: when the backend, or the audit table, fails.
    :raises LockConfigurationError: when the alias is misconfigured.
    """
    backend = locks[alias]
    latency = backend.health()
    if backend.audit is not None:
        _check_audit_table(alias)
    return latency


def _check_audit_table(alias: str) -> None:
    if not apps.is_installed("django_distlock"):
        raise BackendUnavailable(
            f"Lock alias {alias!r} has AUDIT, whose table comes with the 'django_distlock' "
            "app: add it to INSTALLED_APPS and run `manage.py migrate django_distlock`."
        )
    from ..models import LockEvent  # not at import: the app may be absent

    database = router.db_for_write(LockEvent)
    # Within the caller's transaction (ATOMIC_REQUESTS), a savepoint keeps a failure
    # from breaking it.
    atomic = transaction.atomic(using=database) if connections[database].in_atomic_block else None
    try:
        if atomic is None:
            LockEvent.objects.using(database).exists()
        else:
            with atomic:
                LockEvent.objects.using(database).exists()
    except DatabaseError as exc:
        raise BackendUnavailable(
            f"The audit trail of lock alias {alias!r} cannot be written: database "
            f"{database!r} failed: {exc}. Run `manage.py migrate django_distlock`."
        ) from exc


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
