"""What the lock-order checker (``django_distlock.ordering``) costs an acquire+release.

Suite ``uncontended``, group ``order``: the locmem backend (no server: the checker's
cost is Python in the acquiring thread, and a server's round trip would hide it in its
noise), a blocking acquire + release of ``order:<n>``-style names taken **while the
thread holds another lock** (``outer:*``, held for the whole round), so that each
acquire has an order to record or look up: the case where the checker works. Rows:
``DISTLOCK_CHECK_ORDER`` False (the reference), and "warn" (the same work as "raise"
when no order is inverted). The mode is set in :data:`ordering.MODE` before each
acquire of each row (the suite interleaves the rows in one process).
"""

from __future__ import annotations

import functools

from . import lockers, uncontended
from .harness import add_case

GROUP = "order"


def setup() -> None:
    """Set Django up; nothing else to check (no server)."""
    lockers.django_setup()


def describe() -> str:
    """No server: the locks live in the measuring process."""
    return "locmem (process-local, no server), one other lock held by the thread"


class Checked(lockers.DistLock):
    """A locmem handle per acquisition, with the thread holding ``outer`` meanwhile and
    the checker in ``mode``."""

    def __init__(self, key: str, *, mode: str | bool) -> None:
        super().__init__(key, alias="locmem")
        from django_distlock import ordering

        self.ordering, self.mode = ordering, mode
        self.outer = self.locks["locmem"].lock(f"outer:{key}", ttl=lockers.TTL)
        assert self.outer.acquire(blocking=False)

    def acquire(self) -> bool:
        self.ordering.MODE = self.mode
        return super().acquire()

    def close(self) -> None:
        self.outer.release()
        self.ordering.reset_mode()
        super().close()


add_case(uncontended.NAME, "order.off", functools.partial(Checked, mode=False),
         "`DISTLOCK_CHECK_ORDER = False`, another lock held", group=GROUP, reference="off")
add_case(uncontended.NAME, "order.warn", functools.partial(Checked, mode="warn"),
         "`DISTLOCK_CHECK_ORDER = \"warn\"`, another lock held", group=GROUP)
