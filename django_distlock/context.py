"""What a holder is doing: the request path or task name stored with its locks.

``@distlock`` sets it while it acquires (``"GET /orders/7/pay"`` for a view, the
task's name otherwise); ``holder_context("nightly import")`` sets it for any
``with lock(...)`` inside. The admin's held-locks page and ``manage.py distlock
list`` show it beside host, pid and thread.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any

#: Longest context stored (the database backend's holder column holds 255 characters).
MAX_CONTEXT = 200
#: Separates the thread label from the context in a backend's stored holder field.
SEPARATOR = "\x1f"

_current: ContextVar[str] = ContextVar("django_distlock_holder_context", default="")


def clean(text: str, limit: int) -> str:
    """``text`` with control characters (the separator among them) as ``?``, cut to
    ``limit`` characters (an ellipsis marks the cut)."""
    if not text.isprintable():
        text = "".join(char if char.isprintable() else "?" for char in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@contextmanager
def holder_context(text: str) -> Iterator[None]:
    """Within: the locks this thread or task acquires are stored with ``text``
    (listings show it as the holder's context); restored on exit.

    :raises TypeError: for a ``text`` that is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"holder_context() takes a str, not {type(text).__name__}.")
    token = enter(clean(text, MAX_CONTEXT))
    try:
        yield
    finally:
        leave(token)


def enter(text: str) -> Token[str]:
    """Set ``text`` (already clean) as the context; pass the token to :func:`leave`."""
    return _current.set(text)


def leave(token: Token[str]) -> None:
    """Restore the context :func:`enter` replaced."""
    _current.reset(token)


#: ``current_context()``: the context of this thread or task ("" when none is set). The
#: variable's own ``get`` (read at every acquire: no Python frame around it).
current_context: Callable[[], str] = _current.get


def describer(func: Callable[..., Any]) -> Callable[[tuple[Any, ...]], str]:
    """Return ``args -> context`` of a ``@distlock`` call: ``"<METHOD> <path>"`` when a
    request is among the first two positional arguments (functions and methods), else
    the running Celery task's name and id (``"shop.sell_one[<task id>]"``, as Celery's
    log lines show a task), else ``module.qualname`` of ``func`` (Celery's default
    task name)."""
    name = clean(f"{func.__module__}.{getattr(func, '__qualname__', func.__name__)}", MAX_CONTEXT)

    def describe(args: tuple[Any, ...]) -> str:
        for arg in args[:2]:
            if hasattr(arg, "META"):
                method, path = getattr(arg, "method", None), getattr(arg, "path", None)
                if isinstance(method, str) and isinstance(path, str):
                    return clean(f"{method} {path}", MAX_CONTEXT)
        return _celery_task() or name

    return describe


def _celery_task() -> str | None:
    """``"name[id]"`` of the Celery task running in this thread (``"name"`` when it was
    called directly, so has no id), or None outside a task."""
    celery = sys.modules.get("celery")
    if celery is None:
        return None
    try:
        task = celery.current_task
        if not task:
            return None
        task_id = task.request.id
        text = f"{task.name}[{task_id}]" if isinstance(task_id, str) else task.name
        return clean(text, MAX_CONTEXT)
    except Exception:  # outside a worker, Celery's proxy may fail in any way: no name
        return None
