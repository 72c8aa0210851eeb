"""The audit trail (app ``django_distlock.contrib.audit``, label ``distlock_audit``):
the lock events of the aliases whose ``AUDIT`` is on, written to the ``LockEvent``
table off the hot path, the operators' force releases with who and why, the admin's
activity page and the purge (``manage.py distlock_audit purge``). See
``docs/admin-dashboard.md``.

The modules of this package:

- :mod:`.conf`: reading an alias' ``AUDIT`` (:class:`AuditSettings`, :func:`audit_for`);
- :mod:`.recorder`: the signal receivers and the queue a thread writes
  (connected only while an alias audits);
- :mod:`.buckets`: the activity page's pre-aggregated counts, added by the writer;
- :mod:`.totals`: their sums over a window, by the database;
- :mod:`.purge`: deleting old rows (recorded);
- :mod:`.history`: the ended holds, for the lock-order checker across processes;
- :mod:`.tasks`: the Celery task ``django_distlock.purge_audit``.

This module imports no model; import :mod:`.recorder`, :mod:`.buckets`, :mod:`.totals`,
:mod:`.purge` and :mod:`.history` themselves once the app registry is ready.
"""

from .conf import AuditSettings, audit_for, parse_audit

__all__ = ["AuditSettings", "audit_for", "parse_audit"]
