"""The testproject's Celery app: ``celery -A testproject worker``.

Configured from Django settings with the ``CELERY_`` namespace (``CELERY_BROKER_URL``
...); the tasks of every installed app (``tasks.py``) are found. Without a broker
configured the app still imports (Celery's default broker is used only when a task
is sent).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("testproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
