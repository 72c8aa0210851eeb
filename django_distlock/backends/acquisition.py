"""One acquisition of one lock handle: the per-acquisition half of a backend.

A backend's :meth:`~django_distlock.backends.base.BaseLockBackend.acquisition`
builds one :class:`Acquisition` per ``acquire()``; ``backends/locmem.py`` shows
a whole one in a few dozen lines.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from asgiref.sync import sync_to_async

from ..backoff import Backoff, remaining
from ..exceptions import DistLockError
from ..values import ExcInfo, Grant, Miss

if TYPE_CHECKING:
    from ..hold import Hold

T = TypeVar("T")
logger = logging.getLogger("django_distlock")

__all__ = ["Acquisition"]


class Acquisition(abc.ABC):
    """One acquisition of one lock handle: the backend's state from the first
    attempt to the release.

    :meth:`BaseLockBackend.acquisition` builds one for every ``acquire()``. The
    handle then calls, in its own thread or task:

    - :meth:`attempt` once; on a :class:`Miss`, while it may still wait,
      :meth:`wait` and :meth:`attempt` again, until a :class:`Grant`;
    - :meth:`close` exactly once if it ends without a grant (a miss, the
      timeout, an error, an interruption): leave any queue joined on the way;
    - while held: :meth:`extend` and, once, :meth:`release`.

    Where locks expire (``supports_expiry``), one may also be built with the token of
    a grant made elsewhere and never attempted: :meth:`extend` and :meth:`release`
    must then work from the token alone, in any process (QueueOnce's worker extends
    and releases the enqueuer's grant so).

    Each has an ``a``-prefixed async twin (``async_wait`` for :meth:`wait`)
    whose default runs the sync method in a worker thread; a backend with a
    native async client overrides them. A backend that learns by itself that
    the lock is gone (a session lost, a renewal refused) calls
    ``self.hold.mark_lost()``.
    """

    #: The waits' backoff, made at the first wait that sleeps.
    _backoff: Backoff | None = None

    def __init__(
        self,
        hold: Hold,
        token: str,
        blocking: bool,
        deadline: float | None,
    ) -> None:
        self.backend = hold.backend
        #: What the handle asks for and holds: read ``hold.key``, ``hold.ttl``,
        #: ``hold.kind``, ``hold.limit`` and the holder fields from it.
        self.hold = hold
        #: The owner token of this acquisition (128 bits from :func:`os.urandom`, never shown).
        self.token = token
        #: Whether the handle will wait after a miss (an attempt may then skip asking the
        #: server and leave it to :meth:`wait`).
        self.blocking = blocking
        #: When the handle stops waiting, a :func:`time.monotonic` value (None: never).
        self.deadline = deadline

    @abc.abstractmethod
    def attempt(self) -> Grant | Miss:
        """Make one attempt; it does not wait for another holder.

        :raises BackendUnavailable: when the server fails.
        """

    def wait(self, miss: Miss) -> Grant | None:
        """Block until another attempt is worth making, or :attr:`deadline` passes.

        Return None to have the handle attempt again, or a :class:`Grant` when
        the wait itself ended in a grant (a backend that waits in the server).
        This one sleeps with exponential backoff and full jitter, never past the
        holder's expiry (``miss.retry_after``) or the deadline.

        :raises BackendUnavailable: when the server fails.
        """
        time.sleep(self._delay(miss))
        return None

    def close(self) -> None:
        """Clean up after an acquisition that ended without a grant (no error raised)."""
        return None

    @abc.abstractmethod
    def release(self, exc_info: ExcInfo) -> bool:
        """Release the lock; return False if this acquisition no longer held it.

        :param exc_info: the exception leaving a ``with`` block, or Nones.
        :raises BackendUnavailable: when the server fails; the handle may call
            it again.
        """

    @abc.abstractmethod
    def extend(self, ttl: float) -> Grant | None:
        """Make the lease end ``ttl`` seconds from now; None if it is no longer held.

        :raises BackendUnavailable: when the server fails.
        """

    # -- async twins -------------------------------------------------------------

    async def aattempt(self) -> Grant | Miss:
        """Async :meth:`attempt`; a grant it gets after its task was cancelled is released."""
        return await self.abandonable(self.attempt, Miss())

    async def abandonable(self, call: Callable[[], T], nothing: T) -> T:
        """Run ``call`` (which may grant) in ``sync_to_async``'s thread for a task that
        may be cancelled meanwhile: the call runs on in its thread, so a grant it makes
        is released, not left held by nobody for its lease (or its transaction)."""
        mutex, state = threading.Lock(), {"abandoned": False, "delivered": False}

        def run() -> T:
            result = call()
            with mutex:
                if not state["abandoned"]:
                    state["delivered"] = True
                    return result
            if isinstance(result, Grant):
                self._release_abandoned()
            return nothing

        future = asyncio.ensure_future(sync_to_async(run)())
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # Either the thread sees the flag (and releases), or the result was handed
            # over before: release it here, in the same thread (thread-sensitive).
            with mutex:
                state["abandoned"] = True
                delivered = state["delivered"]
            if delivered and isinstance(await future, Grant):
                await asyncio.shield(sync_to_async(self._release_abandoned)())
            raise

    def _release_abandoned(self) -> None:
        """Release a grant that came for a cancelled task."""
        try:
            self.release((None, None, None))
        except DistLockError:
            logger.warning("Releasing %r after its task was cancelled failed", self.hold,
                           exc_info=True)

    async def async_wait(self, miss: Miss) -> Grant | None:
        """Async :meth:`wait`; must not block the event loop."""
        await asyncio.sleep(self._delay(miss))
        return None

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        await sync_to_async(self.close)()

    async def arelease(self, exc_info: ExcInfo) -> bool:
        """Async :meth:`release`."""
        return await sync_to_async(self.release)(exc_info)

    async def aextend(self, ttl: float) -> Grant | None:
        """Async :meth:`extend`."""
        return await sync_to_async(self.extend)(ttl)

    def _delay(self, miss: Miss) -> float:
        if self._backoff is None:
            self._backoff = Backoff()
        delay = self._backoff.next_delay(remaining(self.deadline))
        if miss.retry_after is not None:
            delay = min(delay, max(miss.retry_after, 0.0) + 0.001)
        return max(delay, 0.0)
