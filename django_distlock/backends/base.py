"""The contract every lock backend implements.

A backend is one class (settings, listing, health) and one per-acquisition
class (the protocol of one acquisition). Read this module and
``docs/architecture.md``; ``backends/locmem.py`` is a whole backend in one
short module, and ``django_distlock.testing.LockContract`` is the test suite
every backend passes.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from asgiref.sync import sync_to_async
from django.core import checks

from .. import forksafe  # noqa: F401  (registers the fork handler)
from ..auditing import AuditSettings, parse_audit
from ..backoff import Backoff, remaining
from ..exceptions import DistLockError, InvalidBackendOptions, UnsupportedOperation
from ..handle import Lock
from ..multilock import MultiLock
from ..names import MAX_PREFIX_LENGTH, display_name, storage_key, validate_name
from ..renewal import validate_max_hold
from ..values import (
    DEFAULT,
    ExcInfo,
    Grant,
    LockInfo,
    LockPage,
    Miss,
    _Default,
    owner_token_of,
    validate_owner_id,
    validate_page_args,
    validate_timeout,
    validate_ttl,
)

T = TypeVar("T")
logger = logging.getLogger("django_distlock")

__all__ = [
    "Acquisition",
    "BaseLockBackend",
    "ExcInfo",
    "Grant",
    "LockInfo",
    "LockPage",
    "Miss",
    "check_option_keys",
    "validate_owner_id",
    "validate_page_args",
]

#: Most leases ``semaphore()`` accepts.
MAX_LEASES = 10_000

_PARAM_KEYS = frozenset(
    {"BACKEND", "LOCATION", "OPTIONS", "KEY_PREFIX", "TTL", "TIMEOUT", "AUTO_RENEW", "AUDIT"}
)


def check_option_keys(alias: str, options: Mapping[str, Any], valid: Iterable[str]) -> None:
    """Raise InvalidBackendOptions naming the keys of an alias' ``OPTIONS`` not in ``valid``."""
    unknown = set(options) - set(valid)
    if unknown:
        raise InvalidBackendOptions(
            f"DISTLOCK[{alias!r}]['OPTIONS'] has unknown keys {sorted(unknown)}; "
            f"valid keys are {sorted(valid)}."
        )


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

    Each has an ``a``-prefixed async twin (``async_wait`` for :meth:`wait`)
    whose default runs the sync method in a worker thread; a backend with a
    native async client overrides them. A backend that learns by itself that
    the lock is gone (a session lost, a renewal refused) calls
    ``self.lock.mark_lost()``.
    """

    def __init__(
        self,
        backend: BaseLockBackend,
        lock: Lock,
        token: str,
        blocking: bool,
        deadline: float | None,
    ) -> None:
        self.backend = backend
        #: The handle; read ``lock.key``, ``lock.ttl`` and the holder fields from it.
        self.lock = lock
        #: The owner token of this acquisition (128 bits from :mod:`secrets`, never shown).
        self.token = token
        #: Whether the handle will wait after a miss (an attempt may then skip asking the
        #: server and leave it to :meth:`wait`).
        self.blocking = blocking
        #: When the handle stops waiting, a :func:`time.monotonic` value (None: never).
        self.deadline = deadline
        self._backoff: Backoff | None = None

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
            logger.warning("Releasing %r after its task was cancelled failed", self.lock,
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


class BaseLockBackend(abc.ABC):
    """Base class of lock backends, built by the ``locks`` registry from one alias.

    :param alias: the key of this backend in the ``DISTLOCK`` setting.
    :param params: that alias' dict (``BACKEND``, ``OPTIONS``, ``KEY_PREFIX``,
        ``TTL``, ``TIMEOUT``, ``AUTO_RENEW``, and ``LOCATION`` for server backends).
    :raises InvalidBackendOptions: when a value is unusable. ``__init__`` does
        no I/O, so system checks can build backends to validate settings.

    Capabilities are class attributes; a backend whose capabilities depend on
    its options is one class per set of capabilities (see the database backend).
    """

    #: Grants carry a fencing token that strictly increases with every grant of a key.
    supports_fencing: ClassVar[bool] = True
    #: Locks are leases that end after their TTL on the server's clock (else: held
    #: until released, or until the holder's session ends).
    supports_expiry: ClassVar[bool] = True
    #: :meth:`held_locks` lists the locks held now.
    supports_listing: ClassVar[bool] = True
    #: :meth:`force_release` frees another owner's lock.
    supports_force_release: ClassVar[bool] = True
    #: Locks exclude other processes (False only for process-local backends).
    distributed: ClassVar[bool] = True
    #: ``lock(name, reentrant=True)`` works: the same owner acquires again, counted.
    supports_reentrancy: ClassVar[bool] = False
    #: ``read_lock(name)`` and ``write_lock(name)`` work: readers share, a writer excludes
    #: readers and writers (and exclusive locks of the name), served in arrival order.
    supports_read_write: ClassVar[bool] = False
    #: ``semaphore(name, limit)`` works: up to ``limit`` holders at once.
    supports_semaphore: ClassVar[bool] = False

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        self.alias = alias
        unknown = set(params) - _PARAM_KEYS
        if unknown:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}] has unknown keys {sorted(unknown)}; "
                f"valid keys are {sorted(_PARAM_KEYS)}."
            )
        self.location = params.get("LOCATION")
        prefix = params.get("KEY_PREFIX", "")
        if not isinstance(prefix, str) or len(prefix) > MAX_PREFIX_LENGTH:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['KEY_PREFIX'] must be a str of at most "
                f"{MAX_PREFIX_LENGTH} characters."
            )
        if prefix:
            try:
                validate_name(prefix)
            except ValueError as exc:
                raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]['KEY_PREFIX']: {exc}") from exc
        self.key_prefix: str = prefix
        try:
            self.default_ttl: float = validate_ttl(params.get("TTL", 60))
            self.default_timeout: float | None = validate_timeout(params.get("TIMEOUT", 10))
        except (TypeError, ValueError) as exc:
            raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]: {exc}") from exc
        auto_renew = params.get("AUTO_RENEW", False)
        if not isinstance(auto_renew, bool):
            raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]['AUTO_RENEW'] must be True or False.")
        if auto_renew and not self.supports_expiry:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['AUTO_RENEW']: the locks of {type(self).__name__} do "
                "not expire, so there is no lease to renew; remove AUTO_RENEW."
            )
        #: Whether ``lock()`` renews leases while held by default (``AUTO_RENEW``).
        self.default_auto_renew: bool = auto_renew
        #: Whether and how the audit trail records this alias' lock events (``AUDIT``).
        self.audit: AuditSettings | None = parse_audit(alias, params.get("AUDIT"))
        options = params.get("OPTIONS", {})
        if not isinstance(options, Mapping):
            raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]['OPTIONS'] must be a dict.")
        self.options: Mapping[str, Any] = options
        #: Whether ``lock()`` builds reentrant handles by default (backends that
        #: support it read it from their options).
        self.default_reentrant = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} alias={self.alias!r}>"

    # -- the public API ---------------------------------------------------

    def lock(
        self,
        name: str,
        *,
        ttl: float | _Default = DEFAULT,
        timeout: float | _Default | None = DEFAULT,
        blocking: bool = True,
        reentrant: bool | _Default = DEFAULT,
        owner: str | None = None,
        auto_renew: bool | _Default = DEFAULT,
        max_hold: float | None = None,
    ) -> Lock:
        """Build a handle on the lock ``name``; no I/O happens until ``acquire()``.

        :param name: the lock's name; see :func:`django_distlock.names.validate_name`.
        :param ttl: lease length in seconds (default: the alias' ``TTL``).
        :param timeout: how long ``acquire()`` and ``with`` wait by default,
            in seconds; None waits forever (default: the alias' ``TIMEOUT``).
        :param blocking: whether ``acquire()`` and ``with`` wait at all by default.
        :param reentrant: let the owner acquire again while it holds the lock, each
            acquisition counted and released in turn (Redisson's rule); the default
            is the alias' option. Only where ``supports_reentrancy`` is True.
        :param owner: an owner id that handles share (``reentrant`` only): a handle
            with the same ``owner``, in any thread or process, acquires the lock
            held under it again instead of waiting. Default: a new secret per
            acquisition.
        :param auto_renew: renew the lease every third of ``ttl`` while the handle
            holds it (``docs/renewal.md``); a renewal that finds it gone marks the
            handle ``lost``. Default: the alias' ``AUTO_RENEW``. Only where
            ``supports_expiry`` is True.
        :param max_hold: with ``auto_renew``, the longest the watchdog keeps the
            lock, in seconds from the grant (default: no limit); past it the lease
            is no longer renewed and ends.
        :raises InvalidLockName: for a bad name.
        :raises TypeError, ValueError: for a bad ``ttl``, ``timeout``, ``owner``,
            ``auto_renew`` or ``max_hold``.
        :raises UnsupportedOperation: for ``reentrant=True`` or ``auto_renew=True``
            on a backend without it.
        """
        return self._new_lock(
            name, "exclusive", None, ttl=ttl, timeout=timeout, blocking=blocking,
            reentrant=reentrant, owner=owner, auto_renew=auto_renew, max_hold=max_hold,
        )

    def _new_lock(
        self, name: str, kind: str, limit: int | None, *, ttl: float | _Default = DEFAULT,
        timeout: float | _Default | None = DEFAULT, blocking: bool = True,
        reentrant: bool | _Default = DEFAULT, owner: str | None = None,
        auto_renew: bool | _Default = DEFAULT, max_hold: float | None = None,
    ) -> Lock:
        """Validate the options of :meth:`lock` and build a handle of ``kind``."""
        key = self.make_key(name)
        ttl = self.default_ttl if isinstance(ttl, _Default) else validate_ttl(ttl)
        timeout = (
            self.default_timeout if isinstance(timeout, _Default) else validate_timeout(timeout)
        )
        if not isinstance(blocking, bool):
            raise TypeError("blocking must be True or False.")
        reentrant = self.default_reentrant if isinstance(reentrant, _Default) else reentrant
        if not isinstance(reentrant, bool):
            raise TypeError("reentrant must be True or False.")
        if reentrant and not self.supports_reentrancy:
            raise UnsupportedOperation(
                f"{type(self).__name__} (alias {self.alias!r}) has no reentrant locks."
            )
        owner_token = None
        if owner is not None:
            if not reentrant:
                raise ValueError("owner= names the owner of a reentrant lock: pass reentrant=True.")
            owner_token = owner_token_of(owner)
        auto_renew = self.default_auto_renew if isinstance(auto_renew, _Default) else auto_renew
        if not isinstance(auto_renew, bool):
            raise TypeError("auto_renew must be True or False.")
        if auto_renew and not self.supports_expiry:
            raise UnsupportedOperation(
                f"{type(self).__name__} (alias {self.alias!r}) holds its locks until they are "
                "released (they do not expire): there is no lease for auto_renew to renew."
            )
        max_hold = validate_max_hold(max_hold)
        if max_hold is not None and not auto_renew:
            raise ValueError("max_hold caps the renewals of auto_renew: pass auto_renew=True.")
        return Lock(
            self, name, key, ttl=ttl, timeout=timeout, blocking=blocking,
            reentrant=reentrant, owner_token=owner_token, auto_renew=auto_renew,
            max_hold=max_hold, kind=kind, limit=limit,
        )

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
        options of :meth:`lock`; waiters are served in arrival order.

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

    def multi_lock(self, names: Iterable[str], **options: Any) -> MultiLock:
        """Build a handle that takes the exclusive locks of all ``names`` or none.

        They are acquired in one fixed order (their storage keys sorted), so two
        multi-locks over overlapping names never deadlock, within one shared
        ``timeout``; released in reverse order. Takes the options of :meth:`lock`.

        :raises InvalidLockName: for a bad name.
        :raises ValueError: for no names.
        """
        return MultiLock(self, names, options)

    def make_key(self, name: str) -> str:
        """Return the storage key of ``name``: the alias' ``KEY_PREFIX`` + the name
        (shortened with its digest past :data:`~django_distlock.names.MAX_STORED_NAME`).

        :raises InvalidLockName: for a bad name.
        """
        return self.key_prefix + storage_key(validate_name(name))

    def name_of(self, key: str) -> str:
        """Return the name listings show for a storage key (see :meth:`make_key`)."""
        return display_name(key[len(self.key_prefix) :])

    @abc.abstractmethod
    def acquisition(
        self, lock: Lock, token: str, blocking: bool, deadline: float | None
    ) -> Acquisition:
        """Return a new :class:`Acquisition` of ``lock`` for the owner ``token`` (no I/O):
        ``Acquisition(self, lock, token, blocking, deadline)`` of the backend's own class."""

    @abc.abstractmethod
    def is_locked(self, name: str) -> bool:
        """Return whether anyone holds ``name`` now.

        :raises InvalidLockName: for a bad name.
        :raises BackendUnavailable: when the server fails.
        """

    @abc.abstractmethod
    def held_locks(
        self, prefix: str = "", limit: int = 50, cursor: str | None = None
    ) -> LockPage:
        """Return one page of the locks held now, in key order, whose name starts with
        ``prefix``; pass the page's ``next_cursor`` back for the next page.

        The cost grows with ``limit``, not with the number of locks held.
        Validate the arguments (:func:`validate_page_args`) before any I/O.

        :raises UnsupportedOperation: when ``supports_listing`` is False.
        :raises TypeError, ValueError: for bad arguments.
        :raises BackendUnavailable: when the server fails.
        """

    @abc.abstractmethod
    def force_release(self, name: str, *, owner: str | None = None) -> bool:
        """Free ``name`` whoever holds it; return whether a held lock was freed.

        With ``owner`` (a holder's short owner id, as :attr:`LockInfo.owner` lists it)
        the lock is freed only while that holder has it, checked and freed in one
        step on the server: a lock taken by someone else since it was listed stays
        (False). The former holder finds out at its next ``extend()`` or
        ``release()`` (:class:`~django_distlock.exceptions.LockLost`). Send
        :data:`~django_distlock.signals.lock_force_released` when one was freed.
        Validate the arguments (:func:`validate_owner_id`) before any I/O.

        :raises UnsupportedOperation: when ``supports_force_release`` is False.
        :raises InvalidLockName: for a bad name.
        :raises TypeError, ValueError: for an ``owner`` that is not a short owner id.
        :raises BackendUnavailable: when the server fails.
        """

    @abc.abstractmethod
    def health(self) -> float:
        """Make one round trip to the server and return its latency in seconds.

        :raises BackendUnavailable: when the server fails.
        """

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Return system-check messages about this alias (no I/O). ``kwargs`` are the
        check framework's (``deploy=True`` under ``check --deploy``)."""
        return []

    def close(self) -> None:
        """Release the connections and threads this backend holds in this process."""
        return None
