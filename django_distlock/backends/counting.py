"""How many locks a backend holds: :meth:`CountingMixin.count_held` and its hook.

A count is exact, or a floor ("at least N") when the backend stopped at the cap,
and, where the backend can tell cheaply, has a ceiling too (Redis' listing index
keeps the entries of leases that ended until a listing passes them). A count is
never a guess presented as exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..names import stored_prefix
from ..values import validate_page_args

if TYPE_CHECKING:
    from ..circuit import Circuit

#: The default cap of :meth:`CountingMixin.count_held`: counting stops there.
COUNT_CAP = 10_000
#: The largest cap a caller may ask for.
MAX_COUNT_CAP = 1_000_000


@dataclass(frozen=True, slots=True)
class HeldCount:
    """How many lock names are held now (a name held by several readers or permits
    counts once)."""

    #: Locks counted.
    count: int
    #: True: exactly ``count``. False: at least ``count`` (counting stopped at the cap,
    #: or at the backend's budget of entries read).
    exact: bool
    #: Where the backend knows one cheaply, at most this many (None: no ceiling known).
    at_most: int | None = None


class CountingMixin:
    """The count hook of :class:`~django_distlock.backends.base.BaseLockBackend`."""

    #: :meth:`count_held` counts the locks held now (the backend implements
    #: :meth:`_count_held`).
    supports_counting: ClassVar[bool] = False
    alias: str
    circuit: Circuit

    if TYPE_CHECKING:

        def refuse_unless(self, flag: str, doing: str) -> None: ...

    def count_held(self, prefix: str = "", limit: int = COUNT_CAP) -> HeldCount:
        """Count the locks held now whose name starts with ``prefix``, up to ``limit``.

        The cost grows with ``limit`` (at most), never past it: where more are held,
        the answer is ``HeldCount(limit, exact=False)`` ("at least ``limit``").

        :param prefix: the start of the names counted ("": all).
        :param limit: where counting stops, from 1 to 1,000,000.
        :returns: the count, exact or a floor (see :class:`HeldCount`).
        :raises UnsupportedOperation: when ``supports_counting`` is False.
        :raises TypeError, ValueError: for bad arguments (before any I/O).
        :raises BackendUnavailable: when the server fails, or at once while the
            alias' circuit is open (``FAIL_FAST``).
        """
        prefix, _, _ = validate_page_args(prefix, 1, None)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError("limit must be an int.")
        if not 1 <= limit <= MAX_COUNT_CAP:
            raise ValueError(f"limit must be between 1 and {MAX_COUNT_CAP}, got {limit}.")
        self.refuse_unless("supports_counting", "count held locks")
        # A prefix longer than a long name's stored head counts on the head: at most.
        counted = self.circuit.call(
            "count held locks", self._count_held, stored_prefix(prefix), limit
        )
        if stored_prefix(prefix) != prefix:
            return HeldCount(0, False, counted.count if counted.exact else counted.at_most)
        return counted

    def _count_held(self, prefix: str, limit: int) -> HeldCount:
        """The backend's count behind :meth:`count_held` (where ``supports_counting``):
        the arguments are checked already; count at most ``limit`` (a larger count is
        ``HeldCount(limit, False)``)."""
        raise NotImplementedError  # never called: see BaseLockBackend._check_implementation()
