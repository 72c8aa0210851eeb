"""Session mode on PostgreSQL (``backends/database/session_mode.py``): the contract, and
what session locks add: the name's key, a grant on its own session, the listing from
the server's lock table and the holder's label (force release, by ending the holder's
session, is the contract's)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from django_distlock import locks
from django_distlock.backends.database.session_mode import (
    holder_label,
    read_label,
    server_key,
)
from django_distlock.exceptions import InvalidBackendOptions, SelfDeadlock
from django_distlock.testing import LockContract

from .conftest import LIBRARY_DB, eventually, in_thread, require_pg

_DB = "django_distlock.backends.database.DatabaseBackend"

pytestmark = LIBRARY_DB


class TestPostgresSession(LockContract):
    alias = "pg-session"

    @pytest.fixture(autouse=True)
    def _pg(self) -> None:
        require_pg()


# -- what session locks add -------------------------------------------------------


def test_other_databases_are_refused_at_construction(settings) -> None:
    """Session locks are PostgreSQL's here: SQLite's alias is refused before any I/O,
    saying what to use instead."""
    settings.DISTLOCK = {"s": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default",
                                                           "MODE": "session"}}}
    with pytest.raises(InvalidBackendOptions, match=r"PostgreSQL has; .* is SQLite"):
        locks["s"]


def test_the_key_is_the_servers_for_any_name(unique) -> None:
    """The client's key of a name is the server's (the listing joins on it): names with
    non-ASCII text, a NUL-free control-free 255-character one, a shortened long one."""
    require_pg()
    backend = locks["pg-session"]
    keys = [backend.make_key(name) for name in (
        unique("k"), "é/ü/文字/🔒", "x" * 255, "long/" + "y" * 5000, "a'b\\c")]
    rows = backend.run("SELECT django_distlock_session_key(k) FROM unnest(%s::text[]) k",
                       [keys], "reading keys")
    assert [row[0] for row in rows] == [server_key(key) for key in keys]
    assert len({server_key(key) for key in keys}) == len(keys)


def test_one_thread_holds_a_name_once(unique) -> None:
    """PostgreSQL counts a session's re-acquires of an advisory lock; each grant here has
    a session of its own, so a second handle of the holder's thread misses (or, blocking,
    raises SelfDeadlock at once), and the name is free after the first's release."""
    require_pg()
    backend, name = locks["pg-session"], unique("once")
    first = backend.lock(name)
    assert first.acquire()
    second = backend.lock(name)
    assert not second.acquire(blocking=False)
    with pytest.raises(SelfDeadlock):
        second.acquire(timeout=5)
    assert not in_thread(lambda: backend.lock(name).acquire(timeout=0.2))
    first.release()
    assert not backend.is_locked(name)
    assert in_thread(lambda: _taken_and_released(backend, name))


def _taken_and_released(backend: Any, name: str) -> bool:
    handle = backend.lock(name)
    if not handle.acquire(blocking=False):
        return False
    handle.release()
    return True


def test_a_listing_shows_each_holder_and_waiter_from_the_server(unique) -> None:
    """Who holds and who waits, as the server shows them: host and process (recorded by
    the session once), owner id and thread (its label), since when; the waiter in the
    holder's row count and in ``waiters()``; fencing tokens are not listed (a grant
    writes nothing)."""
    require_pg()
    backend, name = locks["pg-session"], unique("who")
    holder = backend.lock(name)
    assert holder.acquire()
    waiting = threading.Event()

    def wait() -> bool:
        waiting.set()
        handle = backend.lock(name, timeout=10)
        if not handle.acquire():
            return False
        handle.release()
        return True

    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(wait()), name="the-waiter")
    thread.start()
    try:
        assert eventually(lambda: backend.waiters(name), 5)
        (info,) = backend.held_locks(prefix=name)
        (waiter,) = backend.waiters(name)
    finally:
        holder.release()
        thread.join(15)
    assert done == [True]
    assert (info.name, info.owner, info.host, info.pid, info.thread) == (
        name, holder.owner_id, holder.holder.host, os.getpid(), holder.holder.thread)
    assert info.fencing_token is None and info.expires_at is None and info.waiters == 1
    assert info.acquired_at is not None
    assert abs((info.acquired_at - holder.acquired_at).total_seconds()) < 1
    assert (waiter.position, waiter.host, waiter.pid, waiter.thread, waiter.kind) == (
        1, holder.holder.host, os.getpid(), "the-waiter", "exclusive")
    assert waiter.session.startswith("pg ") and len(waiter.owner) == 8


@pytest.mark.parametrize("holder", [
    "MainThread", "MainThread\x1fGET /orders/7/pay", "t\\x\x1f" + "é" * 100,
    "a" * 300, "\x1f", "x\\", "Thread-2 (run)/Task-7\x1fcélery.task"])
def test_a_holder_label_keeps_what_fits_in_63_bytes(holder: str) -> None:
    """The holder text survives PostgreSQL's printable-ASCII ``application_name``: escaped,
    cut whole characters at a time with an ellipsis, read back as it was."""
    label = holder_label("0123abcd", holder)
    assert len(label) <= 63 and label.isascii() and label.isprintable()
    owner, text = read_label(label)
    assert owner == "0123abcd"
    assert text == holder or (text.endswith("…") and holder.startswith(text[:-1]))
