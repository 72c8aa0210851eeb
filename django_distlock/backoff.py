"""Exponential backoff with full jitter, bounded by a deadline."""

from __future__ import annotations

import random
import time


class Backoff:
    """Successive wait times: ``uniform(0, min(cap, base * 2**attempt))``.

    "Full jitter" (AWS architecture blog, 2015) spreads contending clients
    so they do not retry in lockstep.
    """

    __slots__ = ("_attempt", "base", "cap")

    def __init__(self, base: float = 0.002, cap: float = 0.25) -> None:
        if base <= 0 or cap < base:
            raise ValueError("Backoff needs 0 < base <= cap.")
        self.base = base
        self.cap = cap
        self._attempt = 0

    def next_delay(self, remaining: float | None = None) -> float:
        """Return the next wait in seconds, never more than ``remaining``."""
        ceiling = min(self.cap, self.base * (2 ** min(self._attempt, 30)))
        self._attempt += 1
        delay = random.uniform(0, ceiling)
        if remaining is not None:
            delay = min(delay, max(remaining, 0.0))
        return delay


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` value), or None."""
    if deadline is None:
        return None
    return deadline - time.monotonic()
