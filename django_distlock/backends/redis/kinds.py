"""Read-write locks and semaphores on Redis: the acquisition of a read or write lock
or of a semaphore's permit, with the exclusive acquisition's wait and wake-up.

A write lock *is* an exclusive lock of the name (the exclusive scripts, so
``write_lock(name)`` and ``lock(name)`` exclude each other), but for the script
that runs when a waiter gives up, which also wakes the queue's head when readers
hold the name. Readers and permits are shares (see :mod:`.kindscripts`): the same
script calls, the same arguments and replies as the exclusive lock's, so waiting
(``BLPOP`` with the next attempt written behind it, or the event loop's hub), the
give-back of a cancelled attempt and renewal are :class:`.RedisAcquisition`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ...exceptions import SemaphoreLimitMismatch
from ..base import Grant, Miss
from .acquisition import ALIVE_MS, Calls, RedisAcquisition
from .keys import Keys, Packed
from .kindscripts import KIND_SCRIPTS, LIMIT_MISMATCH

if TYPE_CHECKING:
    from ...hold import Hold

#: What the writer's holder field starts with: the listing tells a writer from ``lock()``.
WRITER = "w@"


def share_keys(keys: Keys) -> tuple[str, str]:
    """The ``holders`` and ``data`` keys of a name held in shares (same hash tag).

    :param keys: the name's keys.
    :returns: ``(holders, data)``.
    """
    base = keys.seq[:-1]  # the tag's prefix: ``seq`` is ``<base>n``
    return base + "h:" + keys.member, base + "d:" + keys.member


def kind_calls(keys: Keys, writer: bool) -> Calls:
    """The packed script calls of one name for a kind of lock.

    :param keys: the name's keys.
    :param writer: a write lock's (else a read lock's or a semaphore's).
    :returns: the calls (a write lock's are the exclusive lock's but for ``leave``).
    """
    k = keys
    leave = Packed(KIND_SCRIPTS["leave"], (k.lock, k.queue, k.waiters), ())
    if writer:
        return Calls.of(keys)._replace(leave=leave)
    holders, data = share_keys(keys)
    return Calls(
        keys,
        Packed(
            KIND_SCRIPTS["acquire"],
            (k.lock, k.queue, k.waiters, k.seq, k.listing, holders, data),
            (k.member, ALIVE_MS),
        ),
        Packed(
            KIND_SCRIPTS["release"],
            (k.lock, k.queue, k.waiters, k.listing, holders, data),
            (k.member,),
        ),
        Packed(KIND_SCRIPTS["extend"], (k.lock, holders, data), ()),
        leave,
    )


class RedisKindAcquisition(RedisAcquisition):
    """One acquisition of a read lock or a semaphore's permit (a share of the name)."""

    #: A write lock's (:class:`RedisWriteAcquisition`): the exclusive lock's scripts,
    #: leaving the kinds' queue.
    writer: ClassVar[bool] = False

    def __init__(
        self,
        hold: Hold,
        token: str,
        blocking: bool,
        deadline: float | None,
    ) -> None:
        super().__init__(hold, token, blocking, deadline)
        self.calls = self.backend.kind_calls_for(hold.key, self.writer)
        #: The semaphore's limit; 0 for a read lock (no limit).
        self.limit = hold.limit or 0

    def _acquire_args(self, signal: str, not_after: int) -> tuple[str | int, ...]:
        token, ttl, holder, *rest = super()._acquire_args(signal, not_after)
        return (token, ttl, holder, *rest, self.limit)

    def _result(self, reply: Any, granted_after: float = 0.0) -> Grant | Miss:
        if reply[0] == 0 and reply[1] == LIMIT_MISMATCH:
            stored = int(reply[2])
            raise SemaphoreLimitMismatch(
                f"The stored limit of the semaphore {self.hold.name!r} is {stored}; this "
                f"client gave {self.limit}: every client of a semaphore must use the same "
                "limit (the stored one goes once no permit is held).",
                stored=stored,
                given=self.limit,
            )
        return super()._result(reply, granted_after)


class RedisWriteAcquisition(RedisKindAcquisition):
    """One acquisition of a write lock: the exclusive lock's grant, its holder marked as
    a writer (which readers and the listing read), in the kinds' queue."""

    writer = True

    def _acquire_args(self, signal: str, not_after: int) -> tuple[str | int, ...]:
        token, ttl, holder, *rest = RedisAcquisition._acquire_args(self, signal, not_after)
        return (token, ttl, WRITER + str(holder), *rest)
