"""All-or-nothing locks over several names, on any backend's exclusive locks."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from . import ordering
from .exceptions import (
    BackendUnavailable,
    DistLockError,
    LockLost,
    LockNotAcquired,
    LockNotHeld,
    LockTimeout,
)
from .values import DEFAULT, _Default, validate_timeout

if TYPE_CHECKING:
    from .handle import Lock


class Builds(Protocol):
    """What a multi-lock uses of its backend (every ``BaseLockBackend``)."""

    @property
    def alias(self) -> str:
        """The ``DISTLOCK`` alias."""

    @property
    def lock(self) -> Callable[..., Lock[Any]]:
        """Its ``lock(name, **options)``: a handle on the exclusive lock ``name``."""

logger = logging.getLogger("django_distlock")


class MultiLock:
    """The exclusive locks of several names, taken all or none (Curator's
    ``InterProcessMultiLock``), built by ``backend.multi_lock(names)``.

    The names are taken in one fixed order, their storage keys sorted, so that
    two multi-locks over overlapping names, built in any order, never wait for
    each other in a cycle. A miss or an error releases what was taken (in reverse
    order) before returning or raising. A release releases every member even when
    some raise, and keeps those for ``release()`` again.
    """

    def __init__(
        self, backend: Builds, names: Iterable[str], options: dict[str, Any]
    ) -> None:
        if isinstance(names, str):
            raise TypeError("multi_lock() takes a list of names, not one str.")
        handles: dict[str, Lock] = {}
        for name in names:
            handle = backend.lock(name, **options)
            handles.setdefault(handle.key, handle)
        if not handles:
            raise ValueError("multi_lock() needs at least one name.")
        self.backend = backend
        #: The handles, in the order they are acquired.
        self.handles: list[Lock] = [handles[key] for key in sorted(handles)]
        first = self.handles[0].options
        self.timeout = first.timeout
        self.blocking = first.blocking
        self._taken: list[Lock] = []
        #: A member found lost by a release that left others to release again: raised
        #: once they are released.
        self._pending_lost: LockLost | None = None

    def __repr__(self) -> str:
        names = ", ".join(repr(h.name) for h in self.handles)
        return f"<MultiLock alias={self.backend.alias!r} names=[{names}] held={self.held}>"

    @property
    def held(self) -> bool:
        """Whether every lock is held (and none lost)."""
        return bool(self._taken) and all(h.held for h in self.handles)

    @property
    def lost(self) -> bool:
        """Whether any of the locks was lost."""
        return any(h.lost for h in self._taken)

    @property
    def fencing_tokens(self) -> dict[str, int | None]:
        """The fencing token of each name's current grant."""
        return {h.name: h.fencing_token for h in self.handles}

    def _deadline(
        self, blocking: bool | None, timeout: float | _Default | None
    ) -> tuple[bool, float | None]:
        if self._taken:
            raise DistLockError(f"{self!r} is already acquired.")
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if isinstance(timeout, _Default) else validate_timeout(timeout)
        if not blocking or timeout is None:
            return blocking, None
        return blocking, time.monotonic() + timeout

    @staticmethod
    def _left(deadline: float | None) -> float | None:
        return None if deadline is None else max(deadline - time.monotonic(), 0.0)

    def acquire(
        self, blocking: bool | None = None, timeout: float | _Default | None = DEFAULT
    ) -> bool:
        """Take every lock, or none; return whether they were taken.

        :raises BackendUnavailable: when the server fails (what was taken is released).
        """
        blocking, deadline = self._deadline(blocking, timeout)
        try:
            with ordering.exempt():  # sorted: its own orders form no cycle
                for handle in self.handles:
                    if not handle.acquire(blocking=blocking, timeout=self._left(deadline)):
                        self._give_back()
                        return False
                    self._taken.append(handle)
        except BaseException:
            self._give_back()
            raise
        return True

    async def aacquire(
        self, blocking: bool | None = None, timeout: float | _Default | None = DEFAULT
    ) -> bool:
        """Async :meth:`acquire`."""
        blocking, deadline = self._deadline(blocking, timeout)
        try:
            with ordering.exempt():
                for handle in self.handles:
                    if not await handle.aacquire(blocking=blocking,
                                                 timeout=self._left(deadline)):
                        await self._agive_back()
                        return False
                    self._taken.append(handle)
        except BaseException:
            await self._agive_back()
            raise
        return True

    def _give_back(self) -> None:
        taken, self._taken = self._taken, []
        for handle in reversed(taken):
            with contextlib.suppress(DistLockError):  # it is being given back anyway
                handle.release()

    async def _agive_back(self) -> None:
        taken, self._taken = self._taken, []
        for handle in reversed(taken):
            with contextlib.suppress(DistLockError):
                await handle.arelease()

    def release(self) -> None:
        """Release every lock, in reverse order, even when some raise.

        :raises LockNotHeld: when not acquired.
        :raises BackendUnavailable: after releasing the others, when some could not
            be released (named in the message; chained to the first one's error).
            Those stay taken: ``release()`` again releases them.
        :raises LockLost: after releasing the others, when one had been lost.
        """
        taken = self._releasing()
        failed: list[tuple[Lock, Exception]] = []
        for index, handle in enumerate(reversed(taken)):
            try:
                handle.release()
            except LockLost as exc:
                self._pending_lost = self._pending_lost or exc
            except Exception as exc:
                self._failed(handle, exc, failed)
            except BaseException:  # an interrupt: keep what is not released yet
                self._keep(taken, failed, taken[: len(taken) - index])
                raise
        self._finish(taken, failed)

    async def arelease(self) -> None:
        """Async :meth:`release`."""
        taken = self._releasing()
        failed: list[tuple[Lock, Exception]] = []
        for index, handle in enumerate(reversed(taken)):
            try:
                await handle.arelease()
            except LockLost as exc:
                self._pending_lost = self._pending_lost or exc
            except Exception as exc:
                self._failed(handle, exc, failed)
            except BaseException:  # a cancellation: keep what is not released yet
                self._keep(taken, failed, taken[: len(taken) - index])
                raise
        self._finish(taken, failed)

    def _releasing(self) -> list[Lock]:
        if not self._taken:
            raise LockNotHeld(f"{self!r} is not held.")
        taken, self._taken = self._taken, []
        return taken

    def _failed(self, handle: Lock, exc: Exception, failed: list[tuple[Lock, Exception]]) -> None:
        failed.append((handle, exc))
        logger.warning(
            "Releasing %r of %r failed; releasing the others", handle, self, exc_info=exc
        )

    def _keep(
        self, taken: list[Lock], failed: list[tuple[Lock, Exception]], more: list[Lock]
    ) -> None:
        """Keep the members not released (in the order taken), for a later release()."""
        left = {id(handle) for handle, _ in failed} | {id(handle) for handle in more}
        self._taken = [handle for handle in taken if id(handle) in left]

    def _finish(self, taken: list[Lock], failed: list[tuple[Lock, Exception]]) -> None:
        if failed:
            self._keep(taken, failed, [])
            first = failed[0][1]
            if not all(isinstance(exc, BackendUnavailable) for _, exc in failed):
                raise first  # not a server failure (a bug, or a forked process): as is
            names = [handle.name for handle in self._taken]
            raise BackendUnavailable(
                f"{self!r}: releasing {names!r} failed (the others were released); "
                "release() again releases them."
            ) from first
        lost, self._pending_lost = self._pending_lost, None
        if lost is not None:
            raise lost

    def _not_acquired(self) -> LockNotAcquired:
        names = [h.name for h in self.handles]
        cls = LockTimeout if self.blocking else LockNotAcquired
        return cls(f"Could not take all of {names!r} on {self.backend.alias!r}.",
                   alias=self.backend.alias)

    def __enter__(self) -> MultiLock:
        if not self.acquire():
            raise self._not_acquired()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def __aenter__(self) -> MultiLock:
        if not await self.aacquire():
            raise self._not_acquired()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.arelease()
