from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


class AuditConfig(AppConfig):
    """The audit trail: the lock events of the aliases whose ``AUDIT`` is on, the
    operators' force releases, the activity page and the purge."""

    name = "django_distlock.contrib.audit"
    label = "distlock_audit"
    verbose_name = "Lock audit trail"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_distlock import health, ordering

        from . import checks  # noqa: F401  (registers the system checks)
        from .history import past_holds
        from .probe import check_audit_table
        from .recorder import connect_operator_receivers, follow_audit

        connect_operator_receivers()
        if check_audit_table not in health.extra_probes:
            health.extra_probes.append(check_audit_table)
        follow_audit()  # the receivers of lock events, only while an alias audits
        ordering.register_history("the audit trail", past_holds)
        setting_changed.connect(_follow, dispatch_uid="django_distlock.contrib.audit.follow")


def _follow(*, setting: str, **kwargs: Any) -> None:
    if setting == "DISTLOCK":
        from .recorder import follow_audit

        follow_audit()
