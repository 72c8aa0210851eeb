"""The handle layer's record of what each thread and task holds (``SelfDeadlock``)."""

from __future__ import annotations

import asyncio
import gc
import threading

from django_distlock import locks
from django_distlock.handle import Lock


def _run(target) -> int:
    """Run ``target`` in a new thread, wait for its end, return the thread's ident."""
    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert thread.ident is not None
    return thread.ident


def test_a_new_thread_reusing_a_finished_threads_ident_holds_nothing(unique) -> None:
    """A thread ended while its handle held the lock (the handle outlives it, and may be
    released from any thread); a new thread that the OS gives the same ident holds
    nothing: it waits for the name, it is not refused with SelfDeadlock."""
    backend, name = locks["locmem"], unique()
    kept: list[Lock] = []

    def hold() -> None:
        handle = backend.lock(name, ttl=30)
        assert handle.acquire()
        kept.append(handle)

    first = _run(hold)
    outcomes: list[object] = []

    def wait_if_reused() -> None:
        if threading.get_ident() != first:
            return
        try:
            outcomes.append(backend.lock(name, ttl=30).acquire(timeout=0.1))
        except Exception as exc:
            outcomes.append(exc)

    for _ in range(50):
        _run(wait_if_reused)
        if outcomes:
            break
    assert outcomes, "no new thread reused the ident (the test could not run)"
    assert outcomes == [False]  # held by the first thread's handle: a miss at the timeout
    kept[0].release()


def test_a_new_task_reusing_a_finished_tasks_id_holds_nothing(unique) -> None:
    """The same for asyncio tasks: 200 tasks end while their handles hold 200 names; new
    tasks at the same addresses (the same ``id()``) wait for those names (a miss at the
    timeout) instead of being refused with SelfDeadlock."""
    backend, prefix = locks["locmem"], unique()
    kept: list[Lock] = []

    async def hold(index: int) -> tuple[int, str]:
        handle = backend.lock(f"{prefix}:{index}", ttl=30)
        assert await handle.aacquire()
        kept.append(handle)
        return id(asyncio.current_task()), handle.name

    async def wait_if_reused(names: dict[int, str]) -> object:
        name = names.get(id(asyncio.current_task()))
        if name is None:
            return None
        try:
            return await backend.lock(name, ttl=30).aacquire(timeout=0.01)
        except Exception as exc:
            return exc

    async def main() -> list[object]:
        names = dict(await asyncio.gather(*(hold(index) for index in range(200))))
        await asyncio.sleep(0)  # the loop drops its last references to the finished tasks
        gc.collect()  # ... which are freed: their addresses may be reused
        outcomes = await asyncio.gather(*(wait_if_reused(names) for _ in range(200)))
        return [outcome for outcome in outcomes if outcome is not None]

    outcomes = asyncio.run(main())
    assert outcomes, "no new task reused an id() (the test could not run)"
    assert outcomes == [False] * len(outcomes)
    for handle in kept:
        handle.release()
