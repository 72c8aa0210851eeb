"""Moved to :mod:`django_distlock.audit.settings`; this path stays for imports that name it."""

from .audit.settings import AuditSettings, parse_audit

__all__ = ["AuditSettings", "parse_audit"]
