"""Ready ``on_fail`` and ``on_unavailable`` policies for views decorated with ``distlock``."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse

from .exceptions import BackendUnavailable, LockNotAcquired

__all__ = ["conflict_response", "locked_response", "unavailable_response"]


def _response(status: int, exc: LockNotAcquired) -> HttpResponse:
    body = (
        f"The resource is busy: lock {exc.name!r} is held by another request. "
        "Try again shortly."
    )
    response = HttpResponse(body, status=status, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = "1"
    return response


def locked_response(exc: LockNotAcquired, *args: Any, **kwargs: Any) -> HttpResponse:
    """``on_fail`` policy answering HTTP 423 Locked with a plain-text reason."""
    return _response(423, exc)


def conflict_response(exc: LockNotAcquired, *args: Any, **kwargs: Any) -> HttpResponse:
    """``on_fail`` policy answering HTTP 409 Conflict with a plain-text reason."""
    return _response(409, exc)


def unavailable_response(exc: BackendUnavailable, *args: Any, **kwargs: Any) -> HttpResponse:
    """``on_unavailable`` policy answering HTTP 503 Service Unavailable (``Retry-After:
    5``) with a plain-text reason that names no server."""
    response = HttpResponse(
        "The service is busy: its lock server cannot be reached. Try again shortly.",
        status=503, content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = "5"
    return response
