"""Bulk force release: every lock held by a host, a process (host and pid), an owner, or
under a name prefix, freed in one action and audited as one operation.

:func:`select` pages through ``held_locks()`` of each alias that can list and
force-release, keeping the locks that match; its cost grows with the locks read under
the prefix (at most :data:`MAX_READ`) and it keeps at most :data:`MAX_PER_ACTION`
(``more`` tells that some remain: run the action again). :func:`release_selected`
frees each with ``force_release(name, owner=<the owner id listed>)``, so the server
checks and frees in one step: a lock freed or re-taken by another holder since it was
listed stays. One :data:`~django_distlock.signals.locks_bulk_released` signal
describes the action (its selection, who, why, what was freed and what was skipped);
the audit app records it as one event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django_distlock import signals
from django_distlock.backends.shared_reads import shared_reads
from django_distlock.exceptions import DistLockError, LockConfigurationError, UnsupportedOperation
from django_distlock.handler import locks
from django_distlock.values import MAX_PAGE, LockInfo, validate_owner_id, validate_page_args

#: Most locks one bulk action frees; more that match are reported (``more``), not freed.
MAX_PER_ACTION = 10_000
#: Most listed locks one selection reads across its aliases (a host or owner selection
#: reads every lock under its prefix, since no backend indexes holders).
MAX_READ = 100_000


@dataclass(frozen=True, slots=True)
class Selection:
    """Which held locks a bulk release frees: every given criterion must match."""

    host: str = ""
    pid: int | None = None
    owner: str = ""
    prefix: str = ""

    def __post_init__(self) -> None:
        if self.pid is not None and not self.host:
            raise ValueError("A pid names a process only with its host: give the host too.")
        if not (self.host or self.owner or self.prefix):
            raise ValueError("Select by host (and pid), owner or name prefix; none was given.")
        if self.owner:
            validate_owner_id(self.owner)
        validate_page_args(self.prefix, 1, None)

    def matches(self, info: LockInfo) -> bool:
        """Whether the listed lock ``info`` is selected (its name is under the prefix)."""
        return (
            (not self.host or info.host == self.host)
            and (self.pid is None or info.pid == self.pid)
            and (not self.owner or info.owner == self.owner)
        )

    def describe(self) -> str:
        """The selection in words, as the audit event and the messages show it."""
        parts = [f"host={self.host}"] if self.host else []
        parts += [f"pid={self.pid}"] if self.pid is not None else []
        parts += [f"owner={self.owner}"] if self.owner else []
        parts += [f"prefix={self.prefix}"] if self.prefix else []
        return " ".join(parts)


@dataclass(slots=True)
class Preview:
    """The locks a selection found, and what kept it from seeing everything."""

    locks: list[LockInfo] = field(default_factory=list)
    #: More locks may match: the selection stopped at MAX_PER_ACTION kept or MAX_READ read.
    more: bool = False
    #: Aliases that failed (alias: why), and aliases left out (alias: why not).
    errors: dict[str, str] = field(default_factory=dict)
    skipped_aliases: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Outcome:
    """What a bulk release did: the locks freed, those not freed and why."""

    freed: list[LockInfo] = field(default_factory=list)
    skipped: list[tuple[LockInfo, str]] = field(default_factory=list)


def bulk_aliases(aliases: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """Return the aliases among ``aliases`` (default: all) that can list and force-release,
    and why each other one is left out."""
    usable, left_out = [], {}
    for alias in aliases if aliases is not None else list(locks):
        try:
            backend = locks[alias]
        except LockConfigurationError as exc:
            left_out[alias] = f"misconfigured: {exc}"
            continue
        if not backend.supports_listing:
            left_out[alias] = "cannot list its locks"
        elif not backend.supports_force_release:
            left_out[alias] = "cannot force-release"
        else:
            usable.append(alias)
    return usable, left_out


def select(
    selection: Selection,
    aliases: Sequence[str] | None = None,
    maximum: int = MAX_PER_ACTION,
    max_read: int = MAX_READ,
) -> Preview:
    """Return the held locks ``selection`` matches on ``aliases`` (default: every alias),
    at most ``maximum`` of them, reading at most ``max_read`` listed locks.

    :param selection: the criteria.
    :param aliases: the aliases to read, in order (None: all); those that cannot list or
        force-release are reported in ``skipped_aliases``.
    :param maximum: the most locks kept (``more`` is set when one more matched).
    :param max_read: the most listed locks read (``more`` is set when reached).
    :returns: the preview; an alias whose server fails is reported in ``errors``.
    """
    usable, left_out = bulk_aliases(aliases)
    # One read of what a backend reads whole per call (ZooKeeper's lock parents: every
    # page of the walk read them all again), shared by the selection's pages.
    with shared_reads():
        return _select(selection, usable, Preview(skipped_aliases=left_out), maximum,
                       max_read)


def _select(
    selection: Selection, usable: list[str], preview: Preview, maximum: int, max_read: int
) -> Preview:
    """:func:`select`'s walk of the aliases' pages."""
    read = 0
    for alias in usable:
        backend, cursor = locks[alias], None
        while True:
            if read >= max_read:
                preview.more = True
                return preview
            limit = min(MAX_PAGE, max_read - read)
            try:
                page = backend.held_locks(prefix=selection.prefix, limit=limit, cursor=cursor)
            except (DistLockError, UnsupportedOperation) as exc:
                preview.errors[alias] = str(exc) or type(exc).__name__
                break
            read += len(page) or 1  # a page of names no longer held still costs a read
            for info in page:
                if selection.matches(info):
                    if len(preview.locks) >= maximum:
                        preview.more = True
                        return preview
                    preview.locks.append(info)
            cursor = page.next_cursor
            if cursor is None:
                break
    return preview


def release_selected(
    targets: Sequence[LockInfo], selection: Selection, actor: str, reason: str
) -> Outcome:
    """Free each of ``targets`` while the holder listed still has it (checked and freed in
    one step on the server), then write one audit event of the whole action.

    :param targets: the locks shown to the operator (from :func:`select`); a lock with
        no owner id cannot be checked and is skipped, never freed blindly.
    :param selection: the criteria they were selected by (recorded).
    :param actor: who (a username, or ``command:<user>``).
    :param reason: why.
    :returns: what was freed and what was skipped, with why.
    """
    outcome = Outcome()
    try:
        for info in targets[:MAX_PER_ACTION]:
            _release_one(info, outcome)
    finally:  # what was freed is recorded even when an unexpected error ends the loop
        _audit(outcome, selection, actor, reason)
    return outcome


def _release_one(info: LockInfo, outcome: Outcome) -> None:
    if not info.owner:
        outcome.skipped.append((info, "no owner id to check the holder by"))
        return
    try:
        with signals.by_operator():  # the one signal of the action is sent after
            freed = locks[info.alias].force_release(info.name, owner=info.owner)
    except (DistLockError, LockConfigurationError, LookupError, ValueError, TypeError) as exc:
        outcome.skipped.append((info, f"failed: {exc or type(exc).__name__}"))
        return
    if freed:
        outcome.freed.append(info)
    else:
        outcome.skipped.append((info, "no longer held by that holder"))


def _audit(outcome: Outcome, selection: Selection, actor: str, reason: str) -> None:
    signals.locks_bulk_released.send(
        sender=None, selection=selection, actor=actor, reason=reason,
        freed=list(outcome.freed), skipped=list(outcome.skipped),
    )
