"""One core for the handle's sync and async calls.

The handle's acquire loop, release, extend and renewal are each written once, as a
generator that yields the backend call it needs next, ``(op, acquisition, arg)``,
and receives its result (or has its exception thrown in). :func:`run` makes those
calls blocking (``attempt``, ``wait``, ...); :func:`arun` awaits their async twins
(``aattempt``, ``async_wait``, ...), so a cancelled task's ``CancelledError`` reaches
the core at the call it interrupted, where its ``finally`` blocks clean up as the
sync path's would. The core does no I/O of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Calls(Protocol):
    """The calls a core's steps make: an :class:`~django_distlock.backends.acquisition.
    Acquisition`'s (named here, not imported: the acquisitions sit above this core)."""

    def attempt(self) -> Any: ...
    def wait(self, miss: Any) -> Any: ...
    def release(self, exc_info: Any) -> bool: ...
    def extend(self, ttl: float) -> Any: ...
    def close(self) -> None: ...
    async def aattempt(self) -> Any: ...
    async def async_wait(self, miss: Any) -> Any: ...
    async def arelease(self, exc_info: Any) -> bool: ...
    async def aextend(self, ttl: float) -> Any: ...
    async def aclose(self) -> None: ...


#: ``attempt()``; arg unused.
ATTEMPT = 0
#: ``wait(miss)``; arg: the :class:`~django_distlock.values.Miss`.
WAIT = 1
#: ``release(exc_info)``; arg: the exc_info.
RELEASE = 2
#: ``extend(ttl)``; arg: the ttl.
EXTEND = 3
#: ``close()`` (shielded from cancellation when async); arg unused.
CLOSE = 4

#: A step: the call, the acquisition to make it on, its argument.
Step = tuple[int, Calls, Any]
#: A core: yields steps, receives their results, returns its own.
Core = Generator[Step, Any, T]


def run(core: Core[T]) -> T:
    """Drive ``core`` with blocking calls.

    :param core: the generator of steps.
    :returns: what the core returns.
    :raises: what the core raises (a call's exception is thrown into it first).
    """
    try:
        step = next(core)
        while True:
            op, acquisition, arg = step
            result: Any
            try:
                if op == ATTEMPT:
                    result = acquisition.attempt()
                elif op == RELEASE:
                    result = acquisition.release(arg)
                elif op == WAIT:
                    result = acquisition.wait(arg)
                elif op == EXTEND:
                    result = acquisition.extend(arg)
                else:
                    acquisition.close()
                    result = None
            except BaseException as exc:
                step = core.throw(exc)
            else:
                step = core.send(result)
    except StopIteration as stop:
        return stop.value


async def arun(core: Core[T]) -> T:
    """Drive ``core`` with the async twins of the calls.

    :param core: the generator of steps.
    :returns: what the core returns.
    :raises: what the core raises (a call's exception, ``CancelledError`` too, is
        thrown into it first).
    """
    try:
        op, acquisition, arg = next(core)
        while True:
            result: Any
            try:
                if op == ATTEMPT:
                    result = await acquisition.aattempt()
                elif op == RELEASE:
                    result = await acquisition.arelease(arg)
                elif op == WAIT:
                    result = await acquisition.async_wait(arg)
                elif op == EXTEND:
                    result = await acquisition.aextend(arg)
                else:  # shielded: an acquire cancelled in its wait still cleans up
                    await asyncio.shield(acquisition.aclose())
                    result = None
            except BaseException as exc:
                op, acquisition, arg = core.throw(exc)
            else:
                op, acquisition, arg = core.send(result)
    except StopIteration as stop:
        return stop.value
