"""The contract on the process-local backend (its deployment warning, a system check, is
in ``test_checks.py``)."""

from __future__ import annotations

from django_distlock.testing import LockContract


class TestLocMem(LockContract):
    alias = "locmem"
