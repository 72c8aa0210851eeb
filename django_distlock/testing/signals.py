"""Record the lock signals a piece of code sends (see :mod:`django_distlock.signals`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import signals

#: Every lock signal, by its name in :mod:`django_distlock.signals`.
ALL = ("lock_acquired", "lock_not_acquired", "lock_acquire_failed", "lock_released", "lock_lost",
       "lock_force_released")


@contextmanager
def signals_sent(*labels: str, backend: Any = None) -> Iterator[list[tuple[str, str]]]:
    """``with signals_sent("lock_lost") as sent:`` records each such signal sent inside
    the block as ``(signal name, lock name)``, in order.

    :param labels: the signals' names (default: every lock signal).
    :param backend: record only the signals of this backend instance.
    :raises ValueError: for a name that is not a lock signal.
    """
    unknown = set(labels) - set(ALL)
    if unknown:
        raise ValueError(f"not lock signals: {sorted(unknown)}; they are {list(ALL)}")
    seen: list[tuple[str, str]] = []
    receivers = []
    for label in labels or ALL:

        def receiver(sender: Any, label: str = label, **kwargs: Any) -> None:
            if backend is None or kwargs["backend"] is backend:
                seen.append((label, kwargs["name"]))

        getattr(signals, label).connect(receiver, weak=False)
        receivers.append((label, receiver))
    try:
        yield seen
    finally:
        for label, receiver in receivers:
            getattr(signals, label).disconnect(receiver)
