"""The Celery tasks of django-distlock's core, for Celery beat: ``django_distlock.prune_idle_rows``
prunes the database backend's idle lock rows (:func:`django_distlock.housekeeping.
prune_idle_rows`)::

    CELERY_BEAT_SCHEDULE = {
        "distlock-prune": {
            "task": "django_distlock.prune_idle_rows",
            "schedule": 3600.0,
            "kwargs": {"idle_for": 3600},
        },
    }

A worker imports this module with ``app.autodiscover_tasks()`` when
``django_distlock.contrib.celery`` is in ``INSTALLED_APPS`` (or list it in
``CELERY_IMPORTS``). The audit trail's purge task is in the audit app's ``tasks``.
"""

from __future__ import annotations

from celery import shared_task

from django_distlock.housekeeping import prune_idle_rows

__all__ = ["prune_task"]

#: The Celery task (name ``django_distlock.prune_idle_rows``) for a beat schedule.
prune_task = shared_task(name="django_distlock.prune_idle_rows", ignore_result=False)(
    prune_idle_rows
)
