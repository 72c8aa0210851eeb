"""Force release by an operator: the admin's action and the ``distlock release`` command."""

from __future__ import annotations

from django.utils import timezone

from ..audit.recorder import recorded_elsewhere, write_event
from ..handler import locks
from ..models import LockEvent
from ..values import LockInfo

#: Heads the reason of an audited force release that found the holder gone.
NOT_FREED = "(not released: no longer held by that holder)"


def release_audited(name: str, info: LockInfo, actor: str, reason: str) -> bool:
    """Free ``name`` on ``info.alias`` if the holder ``info`` shows still has it (the
    server checks and frees in one step), write the audit event with ``actor`` and
    ``reason`` either way, and return whether it was freed.

    :raises BackendUnavailable: when the server fails (nothing is written then).
    """
    with recorded_elsewhere():  # this event, with who and why, is written below
        freed = locks[info.alias].force_release(name, owner=info.owner or None)
    held = None
    if info.acquired_at is not None:
        held = (timezone.now() - info.acquired_at).total_seconds()
    write_event(
        at=timezone.now(),
        kind=LockEvent.FORCE_RELEASED,
        alias=info.alias,
        name=name,
        fencing_token=info.fencing_token,
        owner=info.owner,
        host=info.host,
        pid=info.pid,
        thread=info.thread,
        context=info.context,
        held=held,
        actor=actor,
        reason=reason if freed else f"{NOT_FREED} {reason}",
    )
    return freed
