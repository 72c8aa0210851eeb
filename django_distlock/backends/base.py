"""The contract every lock backend implements.

A backend is one class (settings, listing, health: this module) and one
per-acquisition class (the protocol of one acquisition: ``acquisition.py``). The
base class does what every backend would repeat: it validates names and
arguments, refuses what the ``supports_*`` flags say is missing before any I/O,
and sends the signals; a backend writes ``__init__``, ``is_locked()``, ``health()``, the
hooks of :data:`FEATURE_HOOKS` its flags promise, and where it has more to say
``check()``, ``close()``, ``check_fenced_write()`` and ``in_caller_transaction()``
(docs/architecture.md lists them all).
``backends/locmem.py`` is a whole backend in one short module, and
``django_distlock.testing.contract`` is the test suite every backend passes.
"""

from __future__ import annotations

import abc
import contextlib
import inspect
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Self

from django.core import checks

from .. import (
    forksafe,  # noqa: F401  (registers the fork handler)
    signals,
)
from ..circuit import Circuit, validate_fail_fast
from ..exceptions import (
    BackendUnavailable,
    DistLockError,
    InvalidBackendOptions,
    LockConfigurationError,
    UnsupportedOperation,
)
from ..handle import Lock
from ..hold import Hold
from ..kinds import Kind, KindFlag
from ..multilock import MultiLock
from ..names import (
    MAX_PREFIX_LENGTH,
    MAX_STORED_NAME,
    display_name,
    listed_under,
    storage_key,
    stored_prefix,
    validate_name,
)
from ..renewal import validate_max_hold
from ..values import (
    DEFAULT,
    ExcInfo,
    Grant,
    LockInfo,
    LockPage,
    Miss,
    WaiterInfo,
    _Default,
    owner_token_of,
    validate_owner_id,
    validate_page_args,
    validate_timeout,
    validate_ttl,
    validate_waiters_limit,
)
from .acquisition import Acquisition

__all__ = [
    "AGE_ORDERS",
    "COUNT_CAP",
    "FEATURE_HOOKS",
    "MAX_COUNT_CAP",
    "MAX_LEASES",
    "Acquisition",
    "BaseLockBackend",
    "ErrorMap",
    "ExcInfo",
    "Freed",
    "Grant",
    "HeldCount",
    "Kind",
    "LockInfo",
    "LockPage",
    "Miss",
    "OrderedPage",
    "WaiterInfo",
    "check_option_keys",
    "make_cursor",
    "read_cursor",
    "validate_owner_id",
    "validate_page_args",
]


#: The keys of an alias. ``AUDIT`` is read by the audit app
#: (``django_distlock.contrib.audit``), never by a backend; the core's check
#: ``distlock.E006`` reports it when that app is not installed.
_PARAM_KEYS = frozenset(
    {"BACKEND", "LOCATION", "OPTIONS", "KEY_PREFIX", "TTL", "TIMEOUT", "AUTO_RENEW", "AUDIT",
     "FAIL_FAST", "REENTRANT"}
)


def check_option_keys(alias: str, options: Mapping[str, Any], valid: Iterable[str]) -> None:
    """Raise InvalidBackendOptions naming the keys of an alias' ``OPTIONS`` not in ``valid``."""
    unknown = set(options) - set(valid)
    if unknown:
        raise InvalidBackendOptions(
            f"DISTLOCK[{alias!r}]['OPTIONS'] has unknown keys {sorted(unknown)}; "
            f"valid keys are {sorted(valid)}."
        )


#: The optional features that need a method of the backend: each ``supports_*`` flag, and
#: the hook behind its public method (``held_locks()`` calls ``_held_locks()``...). The
#: base's hooks raise NotImplementedError and are never called: where the flag is False
#: the public method refuses first, and a class whose flag is True without its hook
#: cannot be built (:meth:`BaseLockBackend._check_implementation`).
FEATURE_HOOKS: Mapping[str, str] = MappingProxyType({
    "supports_listing": "_held_locks",
    "supports_counting": "_count_held",
    "supports_force_release": "_force_release",
    "supports_waiters": "_waiters",
    "supports_age_order": "_held_locks_by_age",
})


@dataclass(frozen=True, slots=True)
class Freed:
    """What :meth:`BaseLockBackend._force_release` returns when it freed a lock."""

    #: The freed grant's fencing token where the backend learnt it (the signal carries it).
    fencing_token: int | None = None


class ErrorMap:
    """How a backend's client library fails, and what each failure becomes: written once
    per backend (its ``errors.py``) and declared as :attr:`BaseLockBackend.errors`.

    The client boundary (the few functions that call the client library) catches
    :attr:`client` and raises ``translate(exc, doing) from exc`` (Django's
    ``DatabaseErrorWrapper`` does the same for the ORM's drivers): a failure reaches the
    caller as a :class:`~..exceptions.BackendUnavailable`, or as what the map says (a
    :class:`~..exceptions.LockConfigurationError` for a server too old for a command),
    chained to the client's error. Other call sites catch :attr:`client` only to clean up
    (drop a connection, then re-raise), to classify a failure (busy, session ended) or to
    go on without a best-effort call.

    :param client: the client's exception classes that mean "the server failed or could
        not be reached".
    """

    def __init__(self, client: tuple[type[BaseException], ...] = ()) -> None:
        self.client = client

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {[cls.__name__ for cls in self.client]}>"

    def translate(
        self, exc: BaseException, doing: str = "", where: str = ""
    ) -> DistLockError | LockConfigurationError:
        """The error to raise ``from exc`` for the client error ``exc``.

        :param doing: what was being done, for the message ("acquiring a lock").
        :param where: what failed, for the message, as the map's own docstring says
            (the database and lock alias, a cache alias); the map's default when empty.
        """
        during = f" while {doing}" if doing else ""
        return BackendUnavailable(
            f"{where or 'The lock server'} failed{during}: {type(exc).__name__}: {exc}"
        )

    @contextlib.contextmanager
    def translating(self, doing: str = "", where: str = "") -> Iterator[None]:
        """``with errors.translating("listing locks"):`` raises :meth:`translate`'s error
        for a client error of the block. Off the hot path only: the ``with`` costs calls
        that ``benchmarks/hops_budget.json`` counts (the hot path writes the ``except``)."""
        try:
            yield
        except self.client as exc:
            raise self.translate(exc, doing, where) from exc


#: The default cap of :meth:`BaseLockBackend.count_held`: counting stops there.
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


#: The orders: held longest first (``acquired``), expiring soonest first (``expires``).
AGE_ORDERS = ("acquired", "expires")


@dataclass(frozen=True, slots=True)
class OrderedPage:
    """One page of held locks in an age order, with a cursor after each of them."""

    locks: list[LockInfo]
    #: ``cursors[i]`` continues the listing after ``locks[i]`` (a merge of several
    #: aliases' pages stops anywhere in a page).
    cursors: list[str]
    #: False: the listing ended with this page.
    more: bool


def make_cursor(at: str, key: str) -> str:
    """The cursor after the row of ``key`` whose order column reads ``at`` (as stored)."""
    return json.dumps([at, key], separators=(",", ":"))


def read_cursor(cursor: str) -> tuple[str, str]:
    """The (order column as stored, key) a cursor of :func:`make_cursor` carries.

    :raises ValueError: for a value that is not one.
    """
    try:
        at, key = json.loads(cursor)
    except (ValueError, TypeError) as exc:
        raise ValueError("cursor must be a cursor returned by held_locks_by_age().") from exc
    if not isinstance(at, str) or not isinstance(key, str):
        raise ValueError("cursor must be a cursor returned by held_locks_by_age().")
    return at, key


#: Most leases ``semaphore()`` accepts.
MAX_LEASES = 10_000


class BaseLockBackend(abc.ABC):
    """Base class of lock backends, built by the ``locks`` registry from one alias.

    :param alias: the key of this backend in the ``DISTLOCK`` setting.
    :param params: that alias' dict (``BACKEND``, ``OPTIONS``, ``KEY_PREFIX``,
        ``TTL``, ``TIMEOUT``, ``AUTO_RENEW``, and ``LOCATION`` for server backends).
    :raises InvalidBackendOptions: when a value is unusable. ``__init__`` does
        no I/O, so system checks can build backends to validate settings.

    Capabilities are class attributes; a backend whose capabilities depend on
    its options is one class per set of capabilities (see the database backend).
    An optional feature is a ``supports_*`` flag plus a hook: where the flag is
    False the public method refuses (:class:`UnsupportedOperation`) before any I/O.
    A backend implements :meth:`is_locked`, :meth:`health`, names its
    :attr:`kinds` table, and implements the hook of each flag of
    :data:`FEATURE_HOOKS` it sets.
    """

    #: The kinds of lock the backend serves, each with the :class:`Acquisition` class
    #: :meth:`acquisition` builds for it (Django's ``*_class`` way); it must serve
    #: :attr:`Kind.EXCLUSIVE <django_distlock.kinds.Kind.EXCLUSIVE>`. An option that
    #: changes the table picks a subclass, as one that changes a flag does.
    kinds: ClassVar[Mapping[Kind, type[Acquisition]]] = MappingProxyType({})
    #: The client's errors and what each becomes (:class:`ErrorMap`, in the backend's
    #: ``errors.py``); the base's catches nothing (a backend without a client).
    errors: ClassVar[ErrorMap] = ErrorMap()
    #: Why a feature whose flag is False is missing, by flag name (said in the refusal).
    #: Like the flags, a class attribute: an option that turns a feature off picks a
    #: subclass (the database backend's ``MODE``, Redis' ``LISTING``).
    why_unsupported: ClassVar[Mapping[str, str]] = {}

    # Every capability flag is False here ("not supported"): a backend claims only what it
    # sets True, and the contract suite checks each flag both ways.
    #: Grants carry a fencing token that strictly increases with every grant of a key.
    supports_fencing: ClassVar[bool] = False
    #: Locks are leases that end after their TTL on the server's clock (else: held
    #: until released, or until the holder's session ends).
    supports_expiry: ClassVar[bool] = False
    #: :meth:`held_locks` lists the locks held now (the backend implements
    #: :meth:`_held_locks`).
    supports_listing: ClassVar[bool] = False
    #: :meth:`force_release` frees another owner's lock (the backend implements
    #: :meth:`_force_release`).
    supports_force_release: ClassVar[bool] = False
    #: ``force_release(name, owner=...)`` frees the lock only while the holder with that
    #: short owner id has it, checked on the server in the same step (the server keeps
    #: each grant's owner; where False it keeps none, and ``owner=`` is refused).
    supports_force_release_by_owner: ClassVar[bool] = False
    #: :meth:`waiters` lists who waits for a lock, in arrival order (the backend keeps a
    #: queue on its server and implements :meth:`_waiters`).
    supports_waiters: ClassVar[bool] = False
    #: :func:`~django_distlock.leadership.leadership` holds terms here: grants carry fencing
    #: tokens (a term's epoch) and a holder learns that its lock may have passed to another
    #: before the server can grant it to another (a lease it renews and counts on its own
    #: clock, or a session whose suspension the client reports).
    supports_leadership: ClassVar[bool] = False
    #: Locks exclude other processes and machines (False: a process-local backend).
    distributed: ClassVar[bool] = False
    #: Leases are written on the caller's own database connection (the database
    #: backend's lease mode on SQLite), so that one taken inside the caller's open
    #: transaction commits or rolls back with it: :meth:`in_caller_transaction` says
    #: when. False where leases live apart from the caller's transactions.
    leases_join_transaction: ClassVar[bool] = False
    #: ``lock(name, reentrant=True, owner=...)`` works: handles given the same ``owner``,
    #: in any thread or process, share one hold, counted by the server (reentrancy
    #: within one thread or task needs no flag: the handle layer counts it).
    supports_shared_owner: ClassVar[bool] = False
    # supports_read_write and supports_semaphore: with read_lock() and semaphore() below.
    #: The holder of a write lock takes the read side of its name at once (a downgrade:
    #: ``read_lock(name)`` in the same thread or task, kept after the write's release).
    #: Where False, that ``read_lock`` raises :class:`~..exceptions.SelfDeadlock` at once
    #: instead of waiting for its own write lock until the timeout.
    supports_downgrade: ClassVar[bool] = False

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        self._check_implementation()
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
        #: Fails acquires and listings at once while the server is down (``FAIL_FAST``).
        self.circuit = Circuit(
            alias, self.health, validate_fail_fast(alias, params.get("FAIL_FAST", 0))
        )
        options = params.get("OPTIONS", {})
        if not isinstance(options, Mapping):
            raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]['OPTIONS'] must be a dict.")
        self.options: Mapping[str, Any] = options
        reentrant = params.get("REENTRANT", False)
        if not isinstance(reentrant, bool):
            raise InvalidBackendOptions(f"DISTLOCK[{alias!r}]['REENTRANT'] must be True or False.")
        #: Whether ``lock()`` builds reentrant handles by default (``REENTRANT``).
        self.default_reentrant: bool = reentrant

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
        order_class: str | None = None,
    ) -> Lock[Self]:
        """Build a handle on the lock ``name``; no I/O happens until ``acquire()``.

        :param name: the lock's name; see :func:`django_distlock.names.validate_name`.
        :param ttl: lease length in seconds (default: the alias' ``TTL``).
        :param timeout: how long ``acquire()`` and ``with`` wait by default,
            in seconds; None waits forever (default: the alias' ``TIMEOUT``).
        :param blocking: whether ``acquire()`` and ``with`` wait at all by default.
        :param reentrant: let the thread or asyncio task that holds the lock acquire it
            again, through this handle or another reentrant one, at once and with no
            server call: each acquisition is counted, and the lock is free after the
            last release (seed 001's, Curator's and Redisson's rule; every backend).
            Default: the alias' ``REENTRANT``.
        :param owner: an owner id that handles share (``reentrant`` only): a handle
            with the same ``owner``, in any thread or process, acquires the lock
            held under it again instead of waiting, counted by the server. Only where
            ``supports_shared_owner`` is True. Default: a new secret per acquisition.
        :param auto_renew: renew the lease every third of ``ttl`` while the handle
            holds it (``docs/renewal.md``); a renewal that finds it gone marks the
            handle ``lost``. Default: the alias' ``AUTO_RENEW``. Only where
            ``supports_expiry`` is True.
        :param max_hold: with ``auto_renew``, the longest the watchdog keeps the
            lock, in seconds from the grant (default: no limit); past it the lease
            is no longer renewed and ends.
        :param order_class: the lock's class for the lock-order checker
            (``ordering.py``; default: ``@distlock``'s template, or the name with its
            variable parts taken out).
        :raises InvalidLockName: for a bad name.
        :raises TypeError, ValueError: for a bad ``ttl``, ``timeout``, ``owner``,
            ``auto_renew``, ``max_hold`` or ``order_class``.
        :raises UnsupportedOperation: for ``owner=`` or ``auto_renew=True`` on a backend
            without it.
        """
        return self._new_lock(
            name, Kind.EXCLUSIVE, None, ttl=ttl, timeout=timeout, blocking=blocking,
            reentrant=reentrant, owner=owner, auto_renew=auto_renew, max_hold=max_hold,
            order_class=order_class,
        )

    def _new_lock(
        self, name: str, kind: Kind, limit: int | None, *, ttl: float | _Default = DEFAULT,
        timeout: float | _Default | None = DEFAULT, blocking: bool = True,
        reentrant: bool | _Default = DEFAULT, owner: str | None = None,
        auto_renew: bool | _Default = DEFAULT, max_hold: float | None = None,
        order_class: str | None = None,
    ) -> Lock[Self]:
        """Validate the options of :meth:`lock` and build a handle of ``kind``."""
        key = self.make_key(name)
        ttl = self.default_ttl if isinstance(ttl, _Default) else validate_ttl(ttl)
        timeout = (
            self.default_timeout if isinstance(timeout, _Default) else validate_timeout(timeout)
        )
        if not isinstance(blocking, bool):
            raise TypeError("blocking must be True or False.")
        if isinstance(reentrant, _Default):  # the alias' REENTRANT, for the kinds it fits
            reentrant = self.default_reentrant and kind.reentrant_ok
        elif not isinstance(reentrant, bool):
            raise TypeError("reentrant must be True or False.")
        elif reentrant and not kind.reentrant_ok:
            raise UnsupportedOperation(f"{kind.family.capitalize()} are not reentrant.")
        owner_token = None
        if owner is not None:
            if not reentrant:
                raise ValueError("owner= names the owner of a reentrant lock: pass reentrant=True.")
            owner_token = owner_token_of(owner)
            self.refuse_unless("supports_shared_owner", "share a hold between handles by owner=")
        auto_renew = self.default_auto_renew if isinstance(auto_renew, _Default) else auto_renew
        if not isinstance(auto_renew, bool):
            raise TypeError("auto_renew must be True or False.")
        if auto_renew and not self.supports_expiry:
            raise UnsupportedOperation(
                f"{type(self).__name__} (alias {self.alias!r}) holds its locks until they are "
                "released (they do not expire): there is no lease for auto_renew to renew."
            )
        if max_hold is not None:
            max_hold = validate_max_hold(max_hold)
            if not auto_renew:
                raise ValueError(
                    "max_hold caps the renewals of auto_renew: pass auto_renew=True.")
        if order_class is not None and (not isinstance(order_class, str) or not order_class):
            raise TypeError("order_class must be a non-empty str (the lock's class).")
        return Lock(
            self, name, key, ttl=ttl, timeout=timeout, blocking=blocking,
            reentrant=reentrant, owner_token=owner_token, auto_renew=auto_renew,
            max_hold=max_hold, kind=kind, limit=limit, order_class=order_class,
        )

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
        # A printable str short enough to be stored as it is needs neither call (a frame
        # each, per handle built).
        if type(name) is str and name and len(name) <= MAX_STORED_NAME and name.isprintable():
            return self.key_prefix + name
        return self.key_prefix + storage_key(validate_name(name))

    def name_of(self, key: str) -> str:
        """Return the name listings show for a storage key (see :meth:`make_key`)."""
        return display_name(key[len(self.key_prefix) :])

    @classmethod
    def _check_implementation(cls) -> None:
        """Refuse to build a backend class whose flags promise a hook it lacks (as
        :mod:`abc` refuses a class with abstract methods left)."""
        missing = [
            f"{hook}() ({flag} is True)" for flag, hook in FEATURE_HOOKS.items()
            if getattr(cls, flag) and getattr(cls, hook) is getattr(BaseLockBackend, hook)
        ]
        if Kind.EXCLUSIVE not in cls.kinds:
            missing.insert(0, "an acquisition class for Kind.EXCLUSIVE in kinds")
        missing += [
            f"{flag} set beside its kinds table (declare the kind in kinds)"
            for flag in ("supports_read_write", "supports_semaphore")
            if not isinstance(inspect.getattr_static(cls, flag), KindFlag)
        ]
        if missing:
            raise TypeError(f"Can't instantiate {cls.__name__}: it lacks {', '.join(missing)}.")

    def refuse_unless(self, flag: str, doing: str) -> None:
        """Raise UnsupportedOperation (no I/O) when the capability ``flag`` is False.

        :param flag: a ``supports_*`` attribute's name.
        :param doing: what was asked, after "cannot" ("list held locks").
        :raises UnsupportedOperation: when the backend lacks the capability.
        """
        if not getattr(self, flag):
            reason = self.why_unsupported.get(flag, f"{flag} is False")
            raise UnsupportedOperation(
                f"{type(self).__name__} (alias {self.alias!r}) cannot {doing}: {reason}."
            )

    def acquisition(
        self, hold: Hold, token: str, blocking: bool, deadline: float | None
    ) -> Acquisition:
        """Return a new :class:`Acquisition` of ``hold`` for the owner ``token`` (no I/O):
        that of the :attr:`kinds` table for ``hold.kind``.

        :param hold: what the handle acquiring asks for (:class:`~django_distlock.hold.Hold`).
        :param token: the owner token of this acquisition.
        :param blocking: whether the handle will wait after a miss.
        :param deadline: when it stops waiting (:func:`time.monotonic`; None: never).
        :returns: the acquisition, not yet attempted.
        """
        return self.kinds[hold.kind](hold, token, blocking, deadline)

    def in_caller_transaction(self) -> bool:
        """Whether a lease taken now, in this thread, would be written in the caller's
        open transaction, and undone by its rollback (no I/O). Always False where
        :attr:`leases_join_transaction` is False."""
        return False

    @abc.abstractmethod
    def is_locked(self, name: str) -> bool:
        """Return whether anyone holds ``name`` now.

        :raises InvalidLockName: for a bad name.
        :raises BackendUnavailable: when the server fails.
        """

    def held_locks(
        self, prefix: str = "", limit: int = 50, cursor: str | None = None
    ) -> LockPage:
        """Return one page of the locks held now, in key order, whose name starts with
        ``prefix``; pass the page's ``next_cursor`` back for the next page.

        The cost grows with ``limit``, not with the number of locks held. A name over
        200 characters is stored as its first 135, so a ``prefix`` longer than that
        lists such a name when its first 135 characters match (it may not match
        further); a page may then hold fewer than ``limit`` locks.

        :param prefix: the start of the names listed ("": all).
        :param limit: the most locks on the page, from 1 to 1,000.
        :param cursor: a previous page's ``next_cursor`` (None: the first page).
        :returns: the page.
        :raises UnsupportedOperation: when ``supports_listing`` is False.
        :raises TypeError, ValueError: for bad arguments (before any I/O).
        :raises BackendUnavailable: when the server fails, or at once while the
            alias' circuit is open (``FAIL_FAST``).
        """
        prefix, limit, cursor = validate_page_args(prefix, limit, cursor)
        self.refuse_unless("supports_listing", "list held locks")
        matched = stored_prefix(prefix)
        page = self.circuit.call("list held locks", self._held_locks, matched, limit, cursor)
        if matched == prefix:
            return page
        # Longer than a long name's stored head: matched on the head in the server, on
        # the names here (a page may then hold fewer than ``limit``).
        return LockPage([i for i in page.locks if listed_under(i.name, prefix)], page.next_cursor)

    def _held_locks(self, prefix: str, limit: int, cursor: str | None) -> LockPage:
        """The backend's listing behind :meth:`held_locks` (where ``supports_listing``):
        the arguments are checked already; a ``cursor`` is one this backend returned
        only if it says so (raise ValueError for one it cannot read)."""
        raise NotImplementedError  # never called: see _check_implementation()

    def force_release(self, name: str, *, owner: str | None = None) -> bool:
        """Free ``name`` whoever holds it; return whether a held lock was freed.

        With ``owner`` (a holder's short owner id, as :attr:`LockInfo.owner` lists it)
        the lock is freed only while that holder has it, checked and freed in one
        step on the server: a lock taken by someone else since it was listed stays
        (False). The former holder finds out at its next ``extend()`` or
        ``release()`` (:class:`~django_distlock.exceptions.LockLost`). Sends
        :data:`~django_distlock.signals.lock_force_released` when one was freed.

        :param name: the lock's name.
        :param owner: free it only while this short owner id holds it (None: any holder).
        :returns: whether a held lock was freed.
        :raises UnsupportedOperation: when ``supports_force_release`` is False, or, with
            ``owner``, ``supports_force_release_by_owner``.
        :raises InvalidLockName: for a bad name.
        :raises TypeError, ValueError: for an ``owner`` that is not a short owner id.
        :raises BackendUnavailable: when the server fails.
        """
        key = self.make_key(name)
        expected = validate_owner_id(owner)
        self.refuse_unless("supports_force_release", "force-release locks")
        if expected:
            self.refuse_unless("supports_force_release_by_owner",
                               "force-release a lock by its owner")
        freed = self._force_release(key, expected)
        if freed is None:
            return False
        signals.lock_force_released.send(
            sender=type(self), backend=self, alias=self.alias, name=name,
            fencing_token=freed.fencing_token, by_operator=signals.is_by_operator(),
        )
        return True

    def _force_release(self, key: str, owner: str) -> Freed | None:
        """The backend's force release behind :meth:`force_release` (where
        ``supports_force_release``): free the lock of storage key ``key``, only while
        the holder's short owner id is ``owner`` unless it is ""; return :class:`Freed`,
        or None when nothing was freed."""
        raise NotImplementedError  # never called: see _check_implementation()

    def waiters(self, name: str, limit: int = 100) -> list[WaiterInfo]:
        """Return who waits for ``name`` now, the next in line first (at most ``limit``;
        the cost grows with ``limit``, not with the number waiting).

        :param name: the lock's name.
        :param limit: the most waiters returned, from 1 to 1,000.
        :returns: the waiters, in arrival order (empty: nobody waits).
        :raises UnsupportedOperation: when ``supports_waiters`` is False.
        :raises InvalidLockName: for a bad name.
        :raises TypeError, ValueError: for a bad ``limit`` (before any I/O).
        :raises BackendUnavailable: when the server fails, or at once while the
            alias' circuit is open (``FAIL_FAST``).
        """
        key = self.make_key(name)
        limit = validate_waiters_limit(limit)
        self.refuse_unless("supports_waiters", "list the waiters of a lock")
        return self.circuit.call("list waiters", self._waiters, key, limit, name=name)

    def _waiters(self, key: str, limit: int) -> list[WaiterInfo]:
        """The backend's queue read behind :meth:`waiters` (where ``supports_waiters``)
        for the storage key ``key``; the arguments are checked already."""
        raise NotImplementedError  # never called: see _check_implementation()

    @abc.abstractmethod
    def health(self) -> float:
        """Make one round trip to the server and return its latency in seconds.

        :raises BackendUnavailable: when the server fails.
        """

    def check_fenced_write(self, hold: Hold, using: str) -> None:
        """Refuse, before any query, a write fenced by ``hold`` (a handle's, of this backend)
        on the database ``using`` that this backend's locks cannot fence; by default none
        (the fencing token alone guards the write).

        :raises UnsupportedOperation: where the write cannot be fenced (the database
            backend's transaction mode: a write outside the holding transaction).
        :raises LockLost: where the backend finds the lock gone.
        """
        return None

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Return system-check messages about this alias (no I/O). ``kwargs`` are the
        check framework's (``deploy=True`` under ``check --deploy``)."""
        return []

    def close(self) -> None:
        """Release the connections and threads this backend holds in this process."""
        return None

    # The kinds beside the exclusive lock: read-write locks and semaphores.

    #: ``read_lock(name)`` and ``write_lock(name)`` work: readers share, a writer excludes
    #: readers and writers (and exclusive locks of the name); a waiting writer keeps later
    #: readers out. Read from :attr:`kinds` (``Kind.READ`` and ``Kind.WRITE``).
    supports_read_write = KindFlag(Kind.READ, Kind.WRITE)

    #: ``semaphore(name, limit)`` works: up to ``limit`` holders at once. Read from
    #: :attr:`kinds` (``Kind.SEMAPHORE``).
    supports_semaphore = KindFlag(Kind.SEMAPHORE)

    def read_lock(self, name: str, **options: Any) -> Lock[Self]:
        """Build a handle on the shared (read) side of the read-write lock ``name``.

        Takes the options of :meth:`lock`. Readers hold it together; a writer that
        came first keeps later readers out (writers are not starved).

        :raises UnsupportedOperation: when ``supports_read_write`` is False.
        """
        return self.lock_of_kind(Kind.READ, name, **options)

    def write_lock(self, name: str, **options: Any) -> Lock[Self]:
        """Build a handle on the exclusive (write) side of the read-write lock ``name``;
        it also excludes ``lock(name)``. Takes the options of :meth:`lock`.

        :raises UnsupportedOperation: when ``supports_read_write`` is False.
        """
        return self.lock_of_kind(Kind.WRITE, name, **options)

    def semaphore(self, name: str, limit: int, **options: Any) -> Lock[Self]:
        """Build a handle on one of the ``limit`` leases of the counting semaphore
        ``name`` (every client of a name must use the same ``limit``). Takes the
        options of :meth:`lock`; waiters are served in arrival order where the backend
        is fair (docs/kinds.md: not on SQLite, nor for asyncio tasks on PostgreSQL).

        :raises UnsupportedOperation: when ``supports_semaphore`` is False.
        :raises TypeError, ValueError: for a ``limit`` that is not an int from 1 to 10,000.
        """
        return self.lock_of_kind(Kind.SEMAPHORE, name, limit, **options)

    def lock_of_kind(
        self, kind: Kind | str, name: str, limit: int | None = None, **options: Any
    ) -> Lock[Self]:
        """Build a handle of ``kind``: what :meth:`lock`, :meth:`read_lock`,
        :meth:`write_lock` or :meth:`semaphore` build, for a caller that holds the kind
        as a value (``@distlock(kind=...)``). Takes the options of :meth:`lock`.

        :param kind: a :class:`~django_distlock.kinds.Kind` or its value (``"read"``).
        :param limit: a semaphore's leases (``Kind.SEMAPHORE`` only).
        :raises UnsupportedOperation: for a kind not in the backend's :attr:`kinds`, or
            ``reentrant=True`` with a semaphore.
        :raises TypeError, ValueError: for a bad kind or ``limit``.
        """
        kind = Kind.parse(kind, "lock_of_kind()")
        if kind not in self.kinds:
            reason = self.why_unsupported.get(kind.flag, f"{kind.flag} is False")
            raise UnsupportedOperation(
                f"{type(self).__name__} (alias {self.alias!r}) has no {kind.family}: {reason}."
            )
        if kind.takes_limit:
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise TypeError("limit must be an int.")
            if not 1 <= limit <= MAX_LEASES:
                raise ValueError(f"limit must be between 1 and {MAX_LEASES}, got {limit}.")
        elif limit is not None:
            raise ValueError(f"limit= goes with semaphores only, not {kind.family}.")
        return self._new_lock(name, kind, limit, **options)

    # How many locks are held: count_held() and its hook. A count is exact, or a floor
    # ("at least N") when the backend stopped at the cap, and, where the backend can tell
    # cheaply, has a ceiling too (Redis' listing index keeps the entries of leases that
    # ended until a listing passes them). A count is never a guess presented as exact.

    #: :meth:`count_held` counts the locks held now (the backend implements
    #: :meth:`_count_held`).
    supports_counting: ClassVar[bool] = False

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

    # Held locks by age: held_locks_by_age() and its hook. A backend offers it
    # (supports_age_order) only where an index of its server gives the order, so that a
    # page costs what a page of held_locks() costs: the database's lease mode (the lock
    # table's indexes on (acquired_at, name) and (expires_at, name) over the held rows).
    # Redis' listing index is ordered by name, ZooKeeper keeps a lock's age in its node's
    # stat (one read per lock), and a transaction-mode lock is a row locked by an open
    # transaction: for those, an order by age would read every lock held, so they do not
    # offer it (the admin says so beside the merged view).

    #: :meth:`held_locks_by_age` pages through the held locks by age, each page costing
    #: what a page of ``held_locks()`` does (the backend implements
    #: :meth:`_held_locks_by_age`).
    supports_age_order: ClassVar[bool] = False

    def held_locks_by_age(
        self, order: str, prefix: str = "", limit: int = 50, cursor: str | None = None
    ) -> OrderedPage:
        """Return one page of the locks held now, held longest first (``order``
        ``"acquired"``) or expiring soonest first (``"expires"``), ties in key order.

        Without a ``prefix`` the cost grows with ``limit``, not with the locks held.
        With one, the page also reads past the held locks outside it that come earlier
        in the order. Held longest first also reads past leases that ended without a
        release (until their holder's name is taken again or pruned).

        :param order: ``"acquired"`` or ``"expires"``.
        :param prefix: the start of the names listed ("": all).
        :param limit: the most locks on the page, from 1 to 1,000.
        :param cursor: one of a previous page's ``cursors`` (None: the first page).
        :returns: the page.
        :raises UnsupportedOperation: when ``supports_age_order`` is False.
        :raises TypeError, ValueError: for bad arguments (before any I/O).
        :raises BackendUnavailable: when the server fails, or at once while the
            alias' circuit is open (``FAIL_FAST``).
        """
        prefix, limit, cursor = validate_page_args(prefix, limit, cursor)
        if order not in AGE_ORDERS:
            raise ValueError(f"order must be one of {AGE_ORDERS}, got {order!r}.")
        after = read_cursor(cursor) if cursor is not None else None
        self.refuse_unless("supports_age_order", "list held locks by age")
        matched = stored_prefix(prefix)
        page = self.circuit.call(
            "list held locks", self._held_locks_by_age, order, matched, limit, after
        )
        if matched == prefix:
            return page
        # Longer than a long name's stored head (see held_locks()): matched here.
        kept = [i for i, info in enumerate(page.locks) if listed_under(info.name, prefix)]
        return OrderedPage(
            [page.locks[i] for i in kept], [page.cursors[i] for i in kept], page.more
        )

    def _held_locks_by_age(
        self, order: str, prefix: str, limit: int, after: tuple[str, str] | None
    ) -> OrderedPage:
        """The backend's ordered listing behind :meth:`held_locks_by_age` (where
        ``supports_age_order``): the arguments are checked already; ``after`` is the
        (order column as stored, key) of the last row read."""
        raise NotImplementedError  # never called: see BaseLockBackend._check_implementation()
