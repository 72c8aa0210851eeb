"""Force release by an operator: the admin's action and the ``distlock release`` command."""

from __future__ import annotations

from django.utils import timezone

from django_distlock import signals
from django_distlock.handler import locks
from django_distlock.values import LockInfo


def release_audited(name: str, info: LockInfo, actor: str, reason: str) -> bool:
    """Free ``name`` on ``info.alias`` if the holder ``info`` shows still has it (the
    server checks and frees in one step), send
    :data:`~django_distlock.signals.lock_released_by_operator` with ``actor`` and
    ``reason`` either way (the audit app records it), and return whether it was freed.

    :raises BackendUnavailable: when the server fails (no signal is sent then).
    """
    with signals.by_operator():  # the operator signal below says who and why
        freed = locks[info.alias].force_release(name, owner=info.owner or None)
    held = None
    if info.acquired_at is not None:
        held = (timezone.now() - info.acquired_at).total_seconds()
    signals.lock_released_by_operator.send(
        sender=None, alias=info.alias, name=name, info=info, actor=actor, reason=reason,
        freed=freed, held=held,
    )
    return freed
