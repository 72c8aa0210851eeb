"""The kinds of lock a handle takes: one value each, and the one place they are compared.

A backend declares the kinds it serves, and the :class:`~.backends.base.Acquisition`
class of each, in one table (``BaseLockBackend.kinds``); its ``supports_read_write``
and ``supports_semaphore`` flags are read from that table (:class:`KindFlag`). The
values are what the lock tables store (``LockShare.kind``) and what listings show.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = ["Kind", "KindFlag"]


class Kind(StrEnum):
    """A kind of lock (a ``str``: ``Kind.READ == "read"``)."""

    #: ``lock()``: one holder.
    EXCLUSIVE = "exclusive"
    #: ``read_lock()``: readers share; a writer excludes them.
    READ = "read"
    #: ``write_lock()``: one holder, excluding readers and ``lock()`` of the name.
    WRITE = "write"
    #: ``semaphore(name, limit)``: up to ``limit`` holders.
    SEMAPHORE = "semaphore"

    @property
    def family(self) -> str:
        """What the kind is one side or lease of, as messages name it."""
        return _FAMILY[self]

    @property
    def flag(self) -> str:
        """The backend flag that says whether the kind is served."""
        return _FLAG[self]

    @property
    def excludes(self) -> bool:
        """Whether a holder of this kind excludes every other holder of the name."""
        return self is Kind.EXCLUSIVE or self is Kind.WRITE

    @property
    def takes_limit(self) -> bool:
        """Whether a handle of this kind has a ``limit`` (a semaphore's leases)."""
        return self is Kind.SEMAPHORE

    @property
    def reentrant_ok(self) -> bool:
        """Whether a handle of this kind may be reentrant (its holder acquires it again,
        counted): exclusive locks only (a semaphore's second lease is a second holder)."""
        return self is Kind.EXCLUSIVE

    def waits_for_own(self, held: Kind, downgrade: bool) -> bool:
        """Whether a blocking acquire of this kind, by the thread or task that holds the
        name as ``held`` through another handle, could only wait for itself.

        :param held: the kind it holds the name with.
        :param downgrade: whether the backend lets a writer take the read side of its
            own name at once (``supports_downgrade``).
        """
        if self.excludes:
            return True
        return self is Kind.READ and held.excludes and not downgrade

    @classmethod
    def parse(cls, value: object, where: str) -> Kind:
        """Return the kind named ``value``.

        :raises ValueError: for anything else, prefixed with ``where``.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value in _VALUES:
            return cls(value)
        raise ValueError(f"{where}: kind must be one of {_VALUES}, not {value!r}.")


_VALUES = tuple(kind.value for kind in Kind)
_FAMILY = {
    Kind.EXCLUSIVE: "exclusive locks",
    Kind.READ: "read-write locks",
    Kind.WRITE: "read-write locks",
    Kind.SEMAPHORE: "semaphores",
}
_FLAG = {
    Kind.EXCLUSIVE: "kinds",
    Kind.READ: "supports_read_write",
    Kind.WRITE: "supports_read_write",
    Kind.SEMAPHORE: "supports_semaphore",
}


class KindFlag:
    """A ``supports_*`` flag read from the backend class' kinds table: True when the
    table serves every one of ``kinds`` (a class attribute, as the other flags)."""

    def __init__(self, *kinds: Kind) -> None:
        self.kinds = kinds

    def __get__(self, instance: object, owner: Any) -> bool:
        table = owner.kinds
        return all(kind in table for kind in self.kinds)
