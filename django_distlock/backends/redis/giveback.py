"""Giving back, off the caller's path, what an abandoned attempt may hold.

An attempt is abandoned when its caller stops listening before the reply came:
the server did not answer in time, the connection broke, or the thread was
interrupted. The script may have run (or may still run) and granted the lock
to the attempt's owner token, which no handle holds. A late run is refused by
the script itself (``not_after``, see :mod:`.scripts`); a grant whose reply
was lost is given back here: a release-if-mine and a leave-the-queue for that
token, retried in one daemon thread per process until the server answers or
the lease it could hold has ended anyway.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from ...exceptions import BackendUnavailable

if TYPE_CHECKING:
    from .acquisition import Calls
    from .client import Redis

logger = logging.getLogger("django_distlock")

#: Pause between two tries of a give-back the server did not answer.
RETRY_EVERY = 0.5
#: How long each call of a give-back waits for its reply.
CALL_TIMEOUT = 1.0


class GiveBacks:
    """The pending give-backs of this process, and the thread that makes them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Redis, Calls, str, bool, float]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, redis: Redis, calls: Calls, token: str, release: bool, until: float) -> None:
        """Give back ``token``'s lock (if ``release``) and queue entry, trying until
        ``until`` (a :func:`time.monotonic` value)."""
        with self._cond:
            if self._pid != os.getpid():  # forked: the parent's give-backs are its own
                self._due, self._thread, self._pid = [], None, os.getpid()
            entry = (time.monotonic(), next(self._order), redis, calls, token, release, until)
            heapq.heappush(self._due, entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="distlock-redis-giveback", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def pending(self) -> int:
        """How many give-backs wait for the server."""
        with self._cond:
            return len(self._due)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, order, redis, calls, token, release, until = heapq.heappop(self._due)
            try:
                give_back(redis, calls, token, release, CALL_TIMEOUT)
            except BackendUnavailable:
                again = time.monotonic() + RETRY_EVERY
                if again < until:
                    with self._cond:
                        heapq.heappush(
                            self._due, (again, order, redis, calls, token, release, until)
                        )
                else:
                    logger.warning(
                        "Giving back an abandoned Redis lock attempt failed until its lease "
                        "ended; it held nothing longer than that",
                        exc_info=True,
                    )
            except Exception:
                logger.exception("Giving back an abandoned Redis lock attempt failed")


def give_back(redis: Redis, calls: Calls, token: str, release: bool, timeout: float) -> None:
    """Release ``token``'s lock if it holds it, then take ``token`` out of the queue.

    :raises BackendUnavailable: when Redis fails or does not answer in time.
    """
    if release:
        redis.call(calls.release, (token,), timeout)
    redis.call(calls.leave, (token,), timeout)


#: The process' give-backs (all aliases share the thread).
GIVE_BACKS = GiveBacks()
