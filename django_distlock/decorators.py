"""``distlock`` decorator and ``lock()`` context manager, for sync and async code."""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from .exceptions import LockNotAcquired
from .handle import Lock
from .handler import DEFAULT_LOCK_ALIAS, locks
from .values import DEFAULT, _Default

F = TypeVar("F", bound=Callable[..., Any])
OnFail = Literal["raise", "skip"] | Callable[..., Any]


def lock(
    name: str,
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | _Default = DEFAULT,
    timeout: float | _Default | None = DEFAULT,
    blocking: bool = True,
) -> Lock:
    """Return a handle on ``name`` of alias ``using``, for ``with`` or ``async with``.

    ``with lock("order:42", ttl=30, timeout=5) as h:`` acquires or raises
    :class:`~django_distlock.exceptions.LockTimeout` (or
    :class:`~django_distlock.exceptions.LockNotAcquired` when not blocking),
    and releases on exit.

    :raises InvalidLockAlias: for an unknown alias.
    :raises InvalidLockName: for a bad name.
    """
    return locks[using].lock(name, ttl=ttl, timeout=timeout, blocking=blocking)


def distlock(
    key: str | Callable[..., str],
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | _Default = DEFAULT,
    timeout: float | _Default | None = DEFAULT,
    blocking: bool = True,
    on_fail: OnFail = "raise",
    skip_value: Any = None,
) -> Callable[[F], F]:
    """Run the decorated function (sync or async) while holding a lock.

    :param key: a ``str.format`` template filled from the call's bound
        arguments (``"stock:{product_id}"``, ``"user:{request.user.pk}"``),
        or a callable taking the call's arguments and returning the name.
    :param on_fail: when the lock is not had: ``"raise"`` re-raises
        :class:`~django_distlock.exceptions.LockNotAcquired`/``LockTimeout``;
        ``"skip"`` returns ``skip_value`` without calling the function; a
        callable is called as ``on_fail(exc, *args, **kwargs)`` and its result
        returned (see :mod:`django_distlock.http` for view responses).
    :raises TypeError, ValueError: at decoration time, for a template naming
        an argument the function does not have, or a bad ``on_fail``.
    """
    if not (on_fail in ("raise", "skip") or callable(on_fail)):
        raise ValueError("on_fail must be 'raise', 'skip' or a callable.")
    if not (isinstance(key, str) or callable(key)):
        raise TypeError("key must be a str template or a callable returning the lock name.")

    def decorator(func: F) -> F:
        signature = inspect.signature(func)
        name_of = _key_function(key, func, signature)

        def handle(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lock:
            return locks[using].lock(name_of(args, kwargs), ttl=ttl, timeout=timeout,
                                     blocking=blocking)

        def failed(exc: LockNotAcquired, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if on_fail == "raise":
                raise exc
            if on_fail == "skip":
                return skip_value
            return cast(Callable[..., Any], on_fail)(exc, *args, **kwargs)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                held = handle(args, kwargs)
                try:
                    await held.__aenter__()
                except LockNotAcquired as exc:
                    result = failed(exc, args, kwargs)
                    return await result if inspect.isawaitable(result) else result
                async with _Release(held):
                    return await func(*args, **kwargs)

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            held = handle(args, kwargs)
            try:
                held.__enter__()
            except LockNotAcquired as exc:
                return failed(exc, args, kwargs)
            with _Release(held):
                return func(*args, **kwargs)

        return cast(F, wrapper)

    return decorator


class _Release:
    """Release an already acquired handle on exit (sync or async)."""

    def __init__(self, held: Lock) -> None:
        self.held = held

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: Any) -> None:
        self.held.__exit__(*exc_info)

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.held.__aexit__(*exc_info)


def _key_function(
    key: str | Callable[..., str], func: Callable[..., Any], signature: inspect.Signature
) -> Callable[[tuple[Any, ...], dict[str, Any]], str]:
    """Return ``(args, kwargs) -> lock name`` for a template or a callable."""
    if callable(key):
        key_callable = key
        return lambda args, kwargs: key_callable(*args, **kwargs)
    for _, field, _, _ in string.Formatter().parse(key):
        if field is None:
            continue
        head = field.split(".", 1)[0].split("[", 1)[0]
        if not head or head.isdigit():
            raise ValueError(
                f"Lock key template {key!r} must name arguments ({{order_id}}), not positions."
            )
        if head not in signature.parameters:
            raise ValueError(
                f"Lock key template {key!r} names {head!r}, which "
                f"{func.__qualname__}{signature} does not take."
            )

    def render(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return key.format(**bound.arguments)

    return render
