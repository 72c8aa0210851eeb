"""Ready ``on_fail`` policies for views decorated with ``distlock``."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse

from .exceptions import LockNotAcquired


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
