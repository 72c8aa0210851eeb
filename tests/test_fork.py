"""A forked child (a Celery prefork worker, a gunicorn worker forked after the master
ran async code) takes locks from asyncio code like its parent."""

from __future__ import annotations

import asyncio

import pytest

from django_distlock import locks

from .histories import FORK, done, fork_ready

pytestmark = pytest.mark.django_db(transaction=True)


def _child(name: str, out) -> None:
    async def take() -> str:
        async with locks["sqlite-lease"].lock(name, ttl=30, timeout=5):
            return "held"

    try:
        out.put(asyncio.run(asyncio.wait_for(take(), 10)))
    except BaseException as exc:  # the parent reports it
        out.put(f"{type(exc).__name__}: {exc}")
    finally:
        done()


def test_a_child_forked_after_async_calls_takes_locks_from_asyncio(unique) -> None:
    """The parent used asgiref's thread for thread-sensitive ``sync_to_async`` calls (an
    ``aacquire`` on a backend whose calls run in it); the child inherits that executor but
    not its thread, so every such call of the child waited forever: its ``aacquire`` must
    return. (SQLite lease mode's async calls go through ``sync_to_async``.)"""
    name = unique("fork")

    async def parent_takes() -> None:
        async with locks["sqlite-lease"].lock(name, ttl=30, timeout=5):
            pass

    asyncio.run(parent_takes())
    fork_ready()
    out = FORK.Queue()
    child = FORK.Process(target=_child, args=(name, out))
    child.start()
    try:
        assert out.get(timeout=20) == "held"
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    asyncio.run(parent_takes())  # and the parent's thread still serves the parent
