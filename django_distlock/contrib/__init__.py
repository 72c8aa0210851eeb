"""The apps a site adds beside ``django_distlock`` when it wants them (docs/api.md):

- ``django_distlock.contrib.admin``: the admin's held-locks pages, ``manage.py distlock``;
- ``django_distlock.contrib.audit``: the audit trail, the activity page, the purge;
- ``django_distlock.contrib.optimistic``: version columns, fenced writes (a library: no
  models, nothing to add to ``INSTALLED_APPS``; its checks are its models' own);
- ``django_distlock.contrib.celery``: ``QueueOnce``, retry policies, the prune task;
- ``django_distlock.contrib.schedules``: ``once_per_slot``.

and two adapters that are modules, not apps: :mod:`.prometheus`, :mod:`.health_check`.
Imports run from these to the core only (``tests/test_layout.py``).
"""
