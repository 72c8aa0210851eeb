"""Settings of ``test_django_tasks.py``'s processes (Django 6 only): ``tests.settings``
with its ``default`` database on PostgreSQL (``DISTLOCK_PG_NAME``), and Django's
tasks framework on the ``django-tasks-db`` database backend, whose ``db_worker``
command runs the tasks in other processes."""

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, INSTALLED_APPS

DATABASES["default"] = dict(DATABASES["pg"])
INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
