"""Who holds what in this process: the record that turns a wait on oneself into
:class:`~django_distlock.exceptions.SelfDeadlock`.

A thread or task that waits, through a second handle, for a lock it already holds
could only wait out its timeout against itself. The handle layer keeps, per
``(alias, key)``, weak references to the handles that hold it, each with its holder
(:func:`current_holder`); a blocking exclusive acquire first looks there. An entry
counts only while its handle is ``held`` (a lease that ran out or was lost does
not); it goes at the release, at a loss, when a release raised, and when the handle
is garbage-collected.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from asyncio.events import _get_running_loop as _running_loop
from collections import deque
from typing import TYPE_CHECKING

from .exceptions import SelfDeadlock

if TYPE_CHECKING:
    from .hold import Hold

__all__ = [
    "SelfDeadlock",
    "current_holder",
    "held_by",
    "hold",
    "holder_label",
    "identify",
    "let_go",
    "reentry",
    "refuse",
]

Key = tuple[str, str]

#: The handles that hold a lock in this process, per (alias, key), held weakly, each
#: with the holder that acquired it.
_held: dict[Key, dict[weakref.ref[Hold], object]] = {}
_held_mutex = threading.Lock()
#: Entries of handles that were garbage-collected, removed under ``_held_mutex`` by the
#: next registry operation (a weakref callback runs anywhere, even while that mutex is
#: held by its own thread, so it only appends here).
_collected: deque[tuple[Key, weakref.ref[Hold]]] = deque()
#: Each thread's holder identity (see :func:`current_holder`).
_thread_identity = threading.local()


def _forget_held_after_fork() -> None:
    """A forked child holds none of its parent's locks (and its threads are new)."""
    global _held_mutex
    _held_mutex = threading.Lock()
    _held.clear()
    _collected.clear()


os.register_at_fork(after_in_child=_forget_held_after_fork)


def identify() -> tuple[object, str]:
    """Who is acquiring, and its label: :func:`current_holder` and :func:`holder_label`
    in one call (an acquire's).

    The holder is, for an asyncio task, a weak reference to it (CPython gives one task
    the same reference each time; once the task ends, the reference is dead and a new
    task at the same address gets a new one); for a thread, a token in its
    ``threading.local``, dropped when the thread ends. Never a thread's ``ident`` or a
    task's ``id()``, which new threads and tasks reuse.

    :returns: an object that compares equal only for the same thread or task, and
        ``"thread"`` or ``"thread/task"``.
    """
    loop = _running_loop()  # None outside a loop: no RuntimeError raised and caught
    task = None if loop is None else asyncio.current_task(loop)
    if task is not None:
        return weakref.ref(task), f"{threading.current_thread().name}/{task.get_name()}"
    try:
        token = _thread_identity.token
    except AttributeError:
        token = _thread_identity.token = object()
    return token, threading.current_thread().name


def current_holder() -> object:
    """Return who is acquiring: this asyncio task, or else this thread, as an object no
    other task or thread can be while it is referenced (see :func:`identify`).

    :returns: an object that compares equal only for the same thread or task.
    """
    return identify()[0]


def holder_label() -> str:
    """Name the thread, and the asyncio task if any, that is acquiring.

    :returns: ``"thread"`` or ``"thread/task"``.
    """
    return identify()[1]


def _purge_collected() -> None:
    """Drop the entries of handles garbage-collected since (call with ``_held_mutex``)."""
    while _collected:
        key, ref = _collected.popleft()
        _discard(key, ref)


def _discard(key: Key, ref: weakref.ref[Hold]) -> None:
    """Drop one entry (call with ``_held_mutex``)."""
    refs = _held.get(key)
    if refs is not None:
        refs.pop(ref, None)
        if not refs:
            del _held[key]


def refuse(handle: Hold, holder: object, downgrade: bool) -> None:
    """Raise if ``holder`` holds ``handle``'s lock through another live handle, of a kind
    that ``handle``'s would wait for (:meth:`~django_distlock.kinds.Kind.waits_for_own`:
    a reader is blocked by its own write lock, not by its own read lock).

    :param handle: the handle about to wait.
    :param holder: who is acquiring (:func:`current_holder`).
    :param downgrade: whether the backend lets a writer take its own name's read side.
    :raises SelfDeadlock: if the wait could only end at the timeout.
    """
    key = (handle.backend.alias, handle.key)
    if key not in _held:
        # Nobody in this process holds it: no lock taken. Only ``holder`` itself (this
        # thread, or this task, which runs in it) adds the entries that could refuse
        # this wait, so none can appear meanwhile.
        return
    with _held_mutex:
        _purge_collected()
        refs = _held.get(key)
        if not refs:
            return
        for ref, other_holder in tuple(refs.items()):
            other = ref()
            if other is None or not other.held:  # ran out, lost, being released
                _discard(key, ref)
            elif other is not handle and other_holder == holder and (
                handle.kind.waits_for_own(other.kind, downgrade)
            ):
                raise SelfDeadlock(
                    f"This thread (or task) already holds lock {handle.name!r} on "
                    f"{handle.backend.alias!r} through another handle; waiting for it "
                    "would only end at the timeout. Release that handle first.",
                    name=handle.name,
                    alias=handle.backend.alias,
                )


def reentry(handle: Hold, holder: object) -> Hold | None:
    """Return the hold of ``handle``'s name and kind on its alias that ``holder`` holds
    through a reentrant handle, for ``handle`` (reentrant too) to count itself in.

    :param handle: the hold of the reentrant handle acquiring.
    :param holder: who is acquiring (:func:`current_holder`).
    :returns: the hold, or None.
    """
    key = (handle.backend.alias, handle.key)
    with _held_mutex:
        _purge_collected()
        refs = _held.get(key)
        if not refs:
            return None
        for ref, other_holder in refs.items():
            other = ref()
            if (
                other is not None and other_holder == holder and other.reentrant
                and other.kind is handle.kind and other.held
            ):
                return other
    return None


def hold(handle: Hold, holder: object) -> weakref.ref[Hold]:
    """Record that ``holder`` holds ``handle``'s lock (at its grant).

    :param handle: the handle that was granted its lock.
    :param holder: who acquired it (:func:`current_holder` at the acquire).
    :returns: the entry, for :func:`let_go`.
    """
    key = (handle.backend.alias, handle.key)
    ref = weakref.ref(handle, lambda ref: _collected.append((key, ref)))
    with _held_mutex:
        if _collected:
            _purge_collected()
        refs = _held.get(key)
        if refs is None:
            refs = _held[key] = {}
        refs[ref] = holder
    return ref


def held_by(holder: object) -> list[Hold]:
    """The holds ``holder`` (:func:`current_holder`) holds now, on every alias."""
    with _held_mutex:
        _purge_collected()
        found = [ref() for refs in _held.values() for ref, who in refs.items() if who == holder]
    return [hold for hold in found if hold is not None and hold.held]


def let_go(handle: Hold, ref: weakref.ref[Hold]) -> None:
    """Drop the entry :func:`hold` made (the release, a loss, a release that raised).

    :param handle: the handle.
    :param ref: the entry :func:`hold` returned.
    """
    with _held_mutex:
        _discard((handle.backend.alias, handle.key), ref)
