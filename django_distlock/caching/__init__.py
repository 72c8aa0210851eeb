"""Rebuild a missing or expired cache value once, across every process and machine.

``cache.get_or_set()`` has no lock: when a hot key expires, every request that
misses runs the query that rebuilds it (seed 003's "缓存击穿"). These calls have
the same shape, and one caller rebuilds while the others wait for its value,
woken by the lock's release (docs/caching.md)::

    from django_distlock import caching

    price = caching.get_or_set(f"price:{sku}", lambda: compute_price(sku), 300,
                               stale=30)

    @caching.cached("report:{day}", timeout=3600)
    def report(day): ...

    report.invalidate(day)          # after the data behind it changed

Keys written here hold an entry (the value, its freshness, the last build's
duration and the fencing token it was built under): read them through these
calls, not with a plain ``cache.get()``.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from ..decorators import _escape, _key_function
from ..handler import DEFAULT_LOCK_ALIAS, locks
from ..values import DEFAULT, _Default, validate_timeout, validate_ttl
from .fill import MISSING, Fill, Policy, arun, fill, hit, invalidation, run

__all__ = ["aget_or_set", "ainvalidate", "cached", "get_or_set", "invalidate"]

F = TypeVar("F", bound=Callable[..., Any])


def get_or_set(
    key: str,
    default: Any,
    timeout: float | object | None = DEFAULT_TIMEOUT,
    version: int | None = None,
    *,
    cache: str = "default",
    using: str = DEFAULT_LOCK_ALIAS,
    stale: float = 0.0,
    beta: float = 1.0,
    ttl: float | _Default = DEFAULT,
    wait: float | _Default | None = DEFAULT,
    on_timeout: Policy = "build",
    on_unavailable: Policy = "build",
) -> Any:
    """Return the cached value of ``key``; on a miss, exactly one caller across all
    processes runs ``default`` and stores its result, the others wait for it.

    :param key: the cache key (a str, as Django's cache takes it).
    :param default: the value, or a callable returning it (run only by the one caller
        that rebuilds).
    :param timeout: seconds the value stays fresh; None for ever (no early refresh,
        no ``stale``). Default: the cache's ``TIMEOUT``.
    :param version: the key's version, as Django's cache takes it.
    :param cache: the ``CACHES`` alias.
    :param using: the ``DISTLOCK`` alias whose lock serialises the rebuilds.
    :param stale: seconds after ``timeout`` during which the old value is still
        served, at once, to every caller but the one that rebuilds it.
    :param beta: XFetch's beta: a fresh value is rebuilt early by one caller with a
        probability that grows as its expiry nears and with the last build's
        duration (1.0, the paper's; above 1 earlier; 0 never early).
    :param ttl: the lock's lease while a value is built (default: the alias' ``TTL``;
        renewed while the builder runs, where leases expire).
    :param wait: seconds a caller with no value to serve waits for the builder
        (default: the alias' ``TIMEOUT``); None for ever.
    :param on_timeout: past ``wait``: ``"build"`` builds without the lock (the default:
        the page is served, the lock holder's later write wins); ``"stale"`` returns the
        expired value if the cache still held one (entries are kept ``wait`` seconds
        past ``stale`` for it), else raises; ``"raise"`` raises
        :class:`~django_distlock.exceptions.LockTimeout`; a callable is called as
        ``on_timeout(exc)`` and its result returned.
    :param on_unavailable: when the lock server fails and there is no value to serve:
        ``"build"`` (the default: a cache must not take the site down), ``"raise"``
        (:class:`~django_distlock.exceptions.BackendUnavailable`), or a callable as
        ``on_timeout``'s. With a value to serve (early refresh, ``stale``), that value
        is returned.
    :returns: the value.
    :raises TypeError, ValueError: for a bad argument, before any server call.
    :raises InvalidLockAlias: for an unknown ``using``.
    :raises: what ``default`` raises (nothing is stored; the lock is released and the
        next waiter builds in turn).
    """
    cache_object, fresh = _prepare(key, timeout, version, cache, using, stale, beta, ttl,
                                   wait, on_timeout, on_unavailable)
    stored = cache_object.get(key, MISSING, version=version)
    value = hit(stored, beta)
    if value is not MISSING:  # the common case: one read, no lock, no more Python
        return value
    options = _fill(cache_object, fresh, key, version, cache, using, stale, beta, ttl, wait,
                    on_timeout, on_unavailable)
    return run(fill(options, stored), options, default)


async def aget_or_set(
    key: str,
    default: Any,
    timeout: float | object | None = DEFAULT_TIMEOUT,
    version: int | None = None,
    *,
    cache: str = "default",
    using: str = DEFAULT_LOCK_ALIAS,
    stale: float = 0.0,
    beta: float = 1.0,
    ttl: float | _Default = DEFAULT,
    wait: float | _Default | None = DEFAULT,
    on_timeout: Policy = "build",
    on_unavailable: Policy = "build",
) -> Any:
    """Async :func:`get_or_set`: waits never block the event loop; ``default`` may
    return an awaitable (an ``async def`` builder), which is awaited.

    Example: ``await caching.aget_or_set("front", build_front, 60, stale=10)``.
    """
    cache_object, fresh = _prepare(key, timeout, version, cache, using, stale, beta, ttl,
                                   wait, on_timeout, on_unavailable)
    stored = await cache_object.aget(key, MISSING, version=version)
    value = hit(stored, beta)
    if value is not MISSING:
        return value
    options = _fill(cache_object, fresh, key, version, cache, using, stale, beta, ttl, wait,
                    on_timeout, on_unavailable)
    return await arun(fill(options, stored), options, default)


def invalidate(
    key: str,
    version: int | None = None,
    *,
    cache: str = "default",
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | _Default = DEFAULT,
    wait: float | _Default | None = DEFAULT,
) -> bool:
    """Drop the cached value of ``key`` so that the next call rebuilds it.

    Waits (up to ``wait``) for a rebuild under way, then leaves a marker fenced by its
    own grant: a builder that started before the data changed cannot store its
    outdated value afterwards.

    :returns: True when done under the lock; False when the lock was not had (timeout,
        lock server down) and the key was only deleted.
    :raises TypeError, ValueError: for a bad argument.
    """
    options = _options(key, DEFAULT_TIMEOUT, version, cache, using, ttl, wait)
    return cast(bool, run(invalidation(options), options, None))


async def ainvalidate(
    key: str,
    version: int | None = None,
    *,
    cache: str = "default",
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | _Default = DEFAULT,
    wait: float | _Default | None = DEFAULT,
) -> bool:
    """Async :func:`invalidate`."""
    options = _options(key, DEFAULT_TIMEOUT, version, cache, using, ttl, wait)
    return cast(bool, await arun(invalidation(options), options, None))


def cached(
    key: str | Callable[..., str],
    timeout: float | object | None = DEFAULT_TIMEOUT,
    *,
    version: int | None = None,
    cache: str = "default",
    using: str = DEFAULT_LOCK_ALIAS,
    stale: float = 0.0,
    beta: float = 1.0,
    ttl: float | _Default = DEFAULT,
    wait: float | _Default | None = DEFAULT,
    on_timeout: Policy = "build",
    on_unavailable: Policy = "build",
) -> Callable[[F], F]:
    """Cache the decorated function's result (sync or async) with :func:`get_or_set`.

    The wrapper gains ``key(*args, **kwargs)`` (the cache key of a call),
    ``invalidate(*args, **kwargs)`` and, on an ``async def``, ``ainvalidate``.

    :param key: a ``str.format`` template filled from the call's bound arguments, as
        :func:`~django_distlock.distlock`'s (``"report:{day}"``), or a callable taking
        the call's arguments and returning the key.
    :param timeout: and the rest: :func:`get_or_set`'s.
    :raises TypeError, ValueError: when decorating, for a bad option or template.
    """
    _check(timeout, version, stale, beta, ttl, wait, on_timeout, on_unavailable)
    options: dict[str, Any] = {
        "version": version, "cache": cache, "using": using, "stale": stale, "beta": beta,
        "ttl": ttl, "wait": wait, "on_timeout": on_timeout, "on_unavailable": on_unavailable,
    }

    def decorator(func: F) -> F:
        where = f"@cached({key!r}) on {func.__module__}.{func.__qualname__}"
        if not isinstance(key, str) and not callable(key):
            raise TypeError(f"{where}: key must be a str template or a callable.")
        key_of = _key_function(key, func, where)

        def key_method(*args: Any, **kwargs: Any) -> str:
            return cast(str, key_of(args, kwargs))

        def invalidate_call(*args: Any, **kwargs: Any) -> bool:
            return invalidate(key_method(*args, **kwargs), version, cache=cache, using=using,
                              ttl=ttl, wait=wait)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await aget_or_set(
                    key_method(*args, **kwargs), functools.partial(func, *args, **kwargs),
                    timeout, **options,
                )

            async def ainvalidate_call(*args: Any, **kwargs: Any) -> bool:
                return await ainvalidate(key_method(*args, **kwargs), version, cache=cache,
                                         using=using, ttl=ttl, wait=wait)

            async_wrapper.ainvalidate = ainvalidate_call  # type: ignore[attr-defined]
            wrapper: Any = async_wrapper
        else:

            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                return get_or_set(
                    key_method(*args, **kwargs), functools.partial(func, *args, **kwargs),
                    timeout, **options,
                )

            wrapper = sync_wrapper
        wrapper.key = key_method
        wrapper.invalidate = invalidate_call
        return cast(F, wrapper)

    return decorator


# -- arguments -------------------------------------------------------------------


def _check(
    timeout: object, version: object, stale: object, beta: object, ttl: object,
    wait: object, on_timeout: object, on_unavailable: object,
) -> None:
    """Raise TypeError/ValueError for an unusable option (no settings read, no I/O)."""
    if timeout is not DEFAULT_TIMEOUT and timeout is not None:
        _seconds("timeout", timeout)
        if timeout <= 0:  # type: ignore[operator]
            raise ValueError(
                f"timeout must be above 0 seconds (or None: for ever), got {timeout!r}: a "
                "value cached for no time would be rebuilt by every caller in turn."
            )
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise TypeError(f"version must be an int or None, not {type(version).__name__}.")
    _seconds("stale", stale)
    _seconds("beta", beta)
    if not isinstance(ttl, _Default):
        validate_ttl(ttl)
    if not isinstance(wait, _Default):
        validate_timeout(wait)
    _policy("on_timeout", on_timeout, ("build", "stale", "raise"))
    _policy("on_unavailable", on_unavailable, ("build", "raise"))


def _seconds(option: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{option} must be a number, not {type(value).__name__}.")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{option} must be a finite number >= 0, got {value!r}.")


def _policy(option: str, policy: object, names: tuple[str, ...]) -> None:
    if (isinstance(policy, str) and policy in names) or callable(policy):
        return
    choices = ", ".join(repr(name) for name in names)
    error = ValueError if isinstance(policy, str) else TypeError
    raise error(f"{option} must be {choices} or a callable, not {policy!r}.")


def _prepare(
    key: object, timeout: object, version: object, cache: object, using: object,
    stale: object, beta: object, ttl: object, wait: object, on_timeout: object,
    on_unavailable: object,
) -> tuple[BaseCache, float | None]:
    """Check a call's arguments and its aliases (no I/O); return the cache object and
    the value's freshness in seconds (None: for ever)."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"key must be a non-empty str, not {key!r}.")
    if not isinstance(cache, str):
        raise TypeError(f"cache must be the str alias of a CACHES entry, not {cache!r}.")
    if not isinstance(using, str):
        raise TypeError(f"using must be the str alias of a DISTLOCK entry, not {using!r}.")
    _check(timeout, version, stale, beta, ttl, wait, on_timeout, on_unavailable)
    cache_object = caches[cache]
    locks[using]  # an unknown alias raises InvalidLockAlias here, before any I/O
    fresh = cast(
        float | None, cache_object.default_timeout if timeout is DEFAULT_TIMEOUT else timeout
    )
    if fresh is not None and fresh <= 0:
        raise ValueError(
            f"CACHES[{cache!r}]'s TIMEOUT is {fresh!r}: pass a timeout above 0 seconds."
        )
    if stale and fresh is None:
        raise ValueError("stale needs a timeout: a value cached for ever never goes stale.")
    return cache_object, fresh


def _fill(
    cache_object: BaseCache, fresh: float | None, key: str, version: int | None, cache: str,
    using: str, stale: float, beta: float, ttl: object, wait: object, on_timeout: object,
    on_unavailable: object,
) -> Fill:
    """The options of a fill that goes past the first read (arguments checked)."""
    keyed = cache_object.version if version is None else version
    return Fill(
        cache=cache_object, key=key, version=version,
        timeout=None if fresh is None else float(fresh), stale=float(stale),
        beta=float(beta), using=using, lock_name=f"cache:{cache}:{keyed}:{_escape(key)}",
        ttl=ttl,
        wait=locks[using].default_timeout if isinstance(wait, _Default)
        else cast(float | None, wait),
        on_timeout=cast(Policy, on_timeout), on_unavailable=cast(Policy, on_unavailable),
    )


def _options(
    key: str, timeout: object, version: int | None, cache: str, using: str, ttl: object,
    wait: object,
) -> Fill:
    """An invalidation's options, checked (no I/O)."""
    cache_object, fresh = _prepare(key, timeout, version, cache, using, 0.0, 0.0, ttl, wait,
                                   "raise", "raise")
    return _fill(cache_object, fresh, key, version, cache, using, 0.0, 0.0, ttl, wait,
                 "raise", "raise")
