"""A Celery task applying the audit trail's retention, for Celery beat (docs/admin-dashboard.md)::

    # settings.py (or the Celery app's beat_schedule)
    CELERY_BEAT_SCHEDULE = {
        "distlock-purge-audit": {
            "task": "django_distlock.purge_audit",
            "schedule": 3600.0,  # hourly; or crontab(minute=0, hour=3)
        },
    }

A worker imports this module with ``app.autodiscover_tasks()`` (the audit app is in
``INSTALLED_APPS``), or list it in ``CELERY_IMPORTS``. It needs Celery (the ``celery``
extra); without a schedule at all, cron runs ``manage.py distlock_audit purge`` the same
way.
"""

from __future__ import annotations

from celery import shared_task

from .purge import purge

__all__ = ["purge_audit"]


@shared_task(name="django_distlock.purge_audit", ignore_result=True)
def purge_audit(days: float | None = None, operator_actions: bool = False) -> int:
    """Delete the audit rows past each alias' ``RETENTION_DAYS`` (or ``days``), keeping
    the force releases and purges unless ``operator_actions``; the purge is recorded as
    by ``task:purge_audit``.

    :param days: the age, in days, of the oldest row kept; None: each alias' retention.
    :param operator_actions: delete the force releases and purges too.
    :returns: how many rows were deleted.
    :raises ValueError: when ``days`` is unusable.
    """
    return purge(days, operator_actions=operator_actions, actor="task:purge_audit")
