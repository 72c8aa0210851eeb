"""Reads that the calls of one operator's view share: :func:`shared_reads` and :func:`read_once`.

A backend whose listing starts with a read of its whole set of lock names (ZooKeeper
lists a node's children whole: every lock parent's name, per page and per count) makes
that read through :func:`read_once`. Outside a :func:`shared_reads` block it reads every
time, as before; inside one (the admin's held-locks page opens one around its page and
its totals, a bulk release's selection around its walk of the pages) the first call
reads and the later calls of the block reuse the answer, so the page and the count
agree and the names are read once per view, not once per call.
The scope is a context variable: each thread (and each asyncio task) has its own, and a
block's answers end with the block.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar, cast

T = TypeVar("T")

_SHARED: ContextVar[dict[Hashable, Any] | None] = ContextVar(
    "django_distlock_shared_reads", default=None
)


@contextmanager
def shared_reads() -> Iterator[None]:
    """Within the block, each :func:`read_once` key is read at most once (a block inside
    another shares the outer block's reads).

    :returns: a context manager.
    """
    if _SHARED.get() is not None:
        yield
        return
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def read_once(key: Hashable, read: Callable[[], T]) -> T:
    """Return ``read()``; inside a :func:`shared_reads` block, the block's first answer for
    ``key`` (a read that raised is not remembered).

    :param key: what is read (the backend and the path, say).
    :param read: the read.
    :returns: its answer.
    """
    shared = _SHARED.get()
    if shared is None:
        return read()
    if key not in shared:
        shared[key] = read()
    return cast(T, shared[key])
