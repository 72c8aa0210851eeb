"""The audit trail: lock events of the aliases whose ``AUDIT`` is on, written to the
``LockEvent`` table off the hot path.

The modules of this package:

- :mod:`.settings`: reading an alias' ``AUDIT`` (:class:`AuditSettings`, :func:`parse_audit`);
- :mod:`.recorder`: the signal receivers and the queue a thread writes
  (connected only while an alias audits);
- :mod:`.buckets`: the activity page's pre-aggregated counts, added by the writer;
- :mod:`.totals`: their sums over a window, by the database;
- :mod:`.purge`: deleting old rows (``manage.py distlock purge``, recorded).

This module imports no model (the backends read :func:`parse_audit` before the app
registry is ready); import :mod:`.recorder`, :mod:`.buckets`, :mod:`.totals` and
:mod:`.purge` themselves.
"""

from .settings import AuditSettings, parse_audit

__all__ = ["AuditSettings", "parse_audit"]
