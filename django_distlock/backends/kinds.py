"""The kinds of lock a backend may offer beside the exclusive one: the constructors of
:class:`~django_distlock.backends.base.BaseLockBackend` for read-write locks and
semaphores, refused before any I/O where the backend's flags say no."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..exceptions import UnsupportedOperation

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..handle import Lock

__all__ = ["MAX_LEASES", "KindsMixin"]

#: Most leases ``semaphore()`` accepts.
MAX_LEASES = 10_000


class KindsMixin:
    """``read_lock``, ``write_lock`` and ``semaphore`` of
    :class:`~django_distlock.backends.base.BaseLockBackend`."""

    #: ``read_lock(name)`` and ``write_lock(name)`` work: readers share, a writer excludes
    #: readers and writers (and exclusive locks of the name); a waiting writer keeps later
    #: readers out.
    supports_read_write: ClassVar[bool] = False
    #: ``semaphore(name, limit)`` works: up to ``limit`` holders at once.
    supports_semaphore: ClassVar[bool] = False
    alias: str
    if TYPE_CHECKING:  # BaseLockBackend's: validates the options of lock(), builds a handle
        _new_lock: Callable[..., Lock]

    def read_lock(self, name: str, **options: Any) -> Lock:
        """Build a handle on the shared (read) side of the read-write lock ``name``.

        Takes the options of :meth:`lock`. Readers hold it together; a writer that
        came first keeps later readers out (writers are not starved).

        :raises UnsupportedOperation: when ``supports_read_write`` is False.
        """
        return self._kind_lock("read", name, options)

    def write_lock(self, name: str, **options: Any) -> Lock:
        """Build a handle on the exclusive (write) side of the read-write lock ``name``;
        it also excludes ``lock(name)``. Takes the options of :meth:`lock`.

        :raises UnsupportedOperation: when ``supports_read_write`` is False.
        """
        return self._kind_lock("write", name, options)

    def _kind_lock(self, kind: str, name: str, options: dict[str, Any]) -> Lock:
        if not self.supports_read_write:
            raise UnsupportedOperation(
                f"{type(self).__name__} (alias {self.alias!r}) has no read-write locks."
            )
        if options.get("reentrant"):
            raise UnsupportedOperation("Read-write locks are not reentrant.")
        return self._new_lock(name, kind, None, **options)

    def semaphore(self, name: str, limit: int, **options: Any) -> Lock:
        """Build a handle on one of the ``limit`` leases of the counting semaphore
        ``name`` (every client of a name must use the same ``limit``). Takes the
        options of :meth:`lock`; waiters are served in arrival order where the backend
        is fair (docs/kinds.md: not on SQLite, nor for asyncio tasks on PostgreSQL).

        :raises UnsupportedOperation: when ``supports_semaphore`` is False.
        :raises TypeError, ValueError: for a ``limit`` that is not an int from 1 to 10,000.
        """
        if not self.supports_semaphore:
            raise UnsupportedOperation(
                f"{type(self).__name__} (alias {self.alias!r}) has no semaphores."
            )
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError("limit must be an int.")
        if not 1 <= limit <= MAX_LEASES:
            raise ValueError(f"limit must be between 1 and {MAX_LEASES}, got {limit}.")
        if options.get("reentrant"):
            raise UnsupportedOperation("Semaphores are not reentrant.")
        return self._new_lock(name, "semaphore", limit, **options)
