"""Housekeeping on a schedule: prune the database backend's idle lock rows.

The database backend keeps one row per lock name (it carries the name's fencing
counter); :meth:`DatabaseBackend.prune <django_distlock.backends.database.backend.
DatabaseBackend.prune>` deletes the rows of names idle for a while, tokens still
growing (docs/database.md, "Pruning idle rows"). Run it from cron::

    17 * * * *  cd /srv/site && ./manage.py distlock prune --idle 3600

or from Celery beat, with the Celery app (``django_distlock.contrib.celery``) installed,
whose ``tasks`` module a worker's ``autodiscover_tasks()`` imports::

    CELERY_BEAT_SCHEDULE = {
        "distlock-prune": {
            "task": "django_distlock.prune_idle_rows",
            "schedule": 3600.0,
            "kwargs": {"idle_for": 3600},
        },
    }

Other backends have nothing to prune: their keys and nodes go when released or
expired.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from .backends.database.backend import DatabaseBackend
from .handler import locks

logger = logging.getLogger("django_distlock.housekeeping")

__all__ = ["prunable", "prune_idle_rows"]


def prunable(alias: str) -> DatabaseBackend | None:
    """``alias``'s backend when it keeps rows to prune (the database backend), else None.

    :param alias: a ``DISTLOCK`` alias.
    :returns: the backend, or None.
    :raises InvalidBackendOptions: when the alias is misconfigured.
    """
    backend = locks[alias]
    return backend if isinstance(backend, DatabaseBackend) else None


def prune_idle_rows(
    idle_for: float = 3600, aliases: Iterable[str] | None = None, batch: int = 1000
) -> dict[str, int]:
    """Prune every alias that can (or those of ``aliases`` that can); one failing alias
    is logged and the others are still pruned.

    :param idle_for: seconds a row must have been idle.
    :param aliases: the aliases to prune; default: every ``DISTLOCK`` alias.
    :param batch: rows per transaction.
    :returns: alias → rows deleted, for the aliases pruned.
    :raises ValueError: on a bad ``idle_for`` or ``batch``.
    """
    pruned: dict[str, int] = {}
    for alias in list(locks) if aliases is None else aliases:
        backend = prunable(alias)
        if backend is None:
            continue
        try:
            pruned[alias] = backend.prune(idle_for=idle_for, batch=batch)
        except ValueError:
            raise
        except Exception:
            logger.exception("Prune of lock alias %r failed", alias)
            continue
        logger.info("Pruned %d idle lock rows of alias %r", pruned[alias], alias)
    return pruned
