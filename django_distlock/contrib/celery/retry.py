"""Celery tasks under ``@distlock``: the decoration order it enforces, and ``on_fail``
policies that retry the task through Celery (docs/tasks.md).

The lock must be taken where the task *runs*, inside the task's body: so
``@distlock`` goes below Celery's decorator, on the plain function::

    @shared_task(bind=True, acks_late=True, task_reject_on_worker_lost=True)
    @distlock("import:{feed_id}", ttl=60, blocking=False, on_fail=retry_task())
    def import_feed(self, feed_id): ...

``@distlock`` applied to a Celery task object (the other order) raises TypeError
when decorating (the decorator checks it, Celery app installed or not). Celery
itself is imported only when a policy runs: this module is safe to import without it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from django_distlock.exceptions import LockNotAcquired

__all__ = ["retry_delay", "retry_task"]


def retry_delay(retries: int, countdown: float, factor: float, max_countdown: float,
                jitter: bool) -> float:
    """The countdown of retry number ``retries + 1``: ``countdown * factor**retries``,
    at most ``max_countdown``; with ``jitter``, a uniform draw from half of it to all of
    it (retries of tasks that missed together spread out, none comes back at once).

    :param retries: how many times the task was retried already (``request.retries``).
    :param countdown: the first retry's countdown, in seconds.
    :param factor: how much each retry's countdown grows.
    :param max_countdown: the longest countdown.
    :param jitter: whether to draw the countdown at random below its ceiling.
    :returns: the countdown in seconds.
    """
    ceiling = min(countdown * factor ** max(retries, 0), max_countdown)
    return random.uniform(ceiling / 2, ceiling) if jitter else ceiling


def retry_task(
    countdown: float = 1.0,
    *,
    factor: float = 2.0,
    max_countdown: float = 60.0,
    jitter: bool = True,
    max_retries: int | None = None,
) -> Callable[..., Any]:
    """Return an ``on_fail`` policy for a Celery task that did not get its lock: it
    retries the task through Celery's own ``task.retry(countdown=..., exc=...)``, each
    countdown longer than the last (:func:`retry_delay`), with jitter.

    The task is the call's first argument when it is bound (``bind=True``), else
    Celery's ``current_task``. ``task.retry()`` raises ``celery.exceptions.Retry``,
    which ends this run and tells the worker a retry was sent; after ``max_retries``
    (default: the task's own ``max_retries``) it raises the
    :class:`~django_distlock.exceptions.LockNotAcquired` instead. Use it with
    ``blocking=False`` (or a short ``timeout``): a worker process waiting for a lock
    is one that runs nothing else.

    :param countdown: seconds before the first retry.
    :param factor: growth of the countdown per retry.
    :param max_countdown: the longest countdown.
    :param jitter: draw each countdown between half and all of its value.
    :param max_retries: the most retries (None: the task's ``max_retries``).
    :returns: the policy, ``policy(exc, *args, **kwargs)``.
    :raises ValueError: for a negative countdown, a factor below 1, or a
        ``max_countdown`` below ``countdown``.
    """
    if countdown < 0 or factor < 1 or max_countdown < countdown:
        raise ValueError(
            "retry_task() needs countdown >= 0, factor >= 1 and max_countdown >= countdown."
        )

    def policy(exc: LockNotAcquired, *args: Any, **kwargs: Any) -> Any:
        task = _running_task(args)
        delay = retry_delay(task.request.retries or 0, countdown, factor, max_countdown, jitter)
        options: dict[str, Any] = {"countdown": delay, "exc": exc}
        if max_retries is not None:
            options["max_retries"] = max_retries
        raise task.retry(**options)

    return policy


def _running_task(args: tuple[Any, ...]) -> Any:
    """The task of a ``@distlock`` call inside a Celery task: the bound first argument,
    or Celery's current task."""
    from celery import current_task
    from celery.app.task import Task

    if args and isinstance(args[0], Task):
        return args[0]
    task = current_task
    if not task or task.request.id is None:
        raise RuntimeError(
            "retry_task(): no Celery task is running here (the policy retries the task "
            "it is called in; call the task through a worker, or bind=True)."
        )
    return task
