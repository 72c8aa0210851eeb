"""Celery and django-distlock (app ``django_distlock.contrib.celery``; docs/tasks.md):

- :mod:`.retry`: ``on_fail`` policies that retry a ``@distlock``'d task through Celery
  (:func:`retry_task`, :func:`retry_delay`);
- :mod:`.once`: :class:`~.once.QueueOnce`, a task base that refuses an equal task while
  one is queued or running (import it from there: it imports Celery);
- :mod:`.tasks`: the task ``django_distlock.prune_idle_rows`` for Celery beat;
- :mod:`.testing`: ``CeleryWorkers``, real workers for a test suite.

This module imports no Celery: it is safe to import without it.
"""

from .retry import retry_delay, retry_task

__all__ = ["retry_delay", "retry_task"]
