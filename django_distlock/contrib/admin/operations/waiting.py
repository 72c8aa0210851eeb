"""Who waits for one lock, for the admin's detail page and ``distlock inspect``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django_distlock.exceptions import DistLockError
from django_distlock.handler import locks
from django_distlock.values import WaiterInfo

#: Most waiters a detail page or ``inspect`` shows.
SHOWN = 100


@dataclass(frozen=True)
class Waiting:
    """The waiters of one lock as far as its backend knows them."""

    waiters: list[WaiterInfo] = field(default_factory=list)
    #: Why they are not listed ("" when they are): the backend cannot tell, or failed.
    unknown: str = ""
    #: Whether more wait than are listed (the list stopped at its limit).
    more: bool = False


def who_waits(alias: str, name: str, limit: int = SHOWN) -> Waiting:
    """Return the waiters of ``name`` on ``alias``, the next in line first.

    :param alias: a configured lock alias.
    :param name: the lock's name (already validated by the caller).
    :param limit: the most waiters listed (one more is read, to tell there are more).
    :returns: the waiters, or why they are unknown.
    """
    backend = locks[alias]
    if not backend.supports_waiters:
        reason = backend.why_unsupported.get(
            "supports_waiters", "its server keeps no queue of waiters"
        )
        return Waiting(unknown=f"{type(backend).__name__} cannot tell who waits: {reason}.")
    try:
        found = backend.waiters(name, limit=limit + 1)
    except DistLockError as exc:
        return Waiting(unknown=f"{alias}: {exc}")
    return Waiting(found[:limit], more=len(found) > limit)


def waited(info: WaiterInfo, now: datetime | None = None) -> float | None:
    """Seconds ``info`` has waited (None when its backend does not know since when).

    :param info: a waiter.
    :param now: the time to count to (default: now).
    :returns: the seconds, never negative (the server's clock may be ahead of ours).
    """
    if info.since is None:
        return None
    return max(((now or datetime.now(UTC)) - info.since).total_seconds(), 0.0)


def waiter_dict(info: WaiterInfo, now: datetime | None = None) -> dict[str, Any]:
    """``info`` as JSON-ready values, with ``waited_s`` (see :func:`waited`).

    :param info: a waiter.
    :param now: the time to count to (default: now).
    :returns: the dict.
    """
    return {
        "position": info.position,
        "owner": info.owner,
        "since": info.since.isoformat() if info.since else None,
        "waited_s": waited(info, now),
        "host": info.host,
        "pid": info.pid,
        "thread": info.thread,
        "context": info.context,
        "kind": info.kind,
        "session": info.session,
    }
