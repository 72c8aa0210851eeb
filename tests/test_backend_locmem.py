"""The contract on the process-local backend, and its deployment warning."""

from __future__ import annotations

import pytest
from django.core import checks

from django_distlock.testing import LockContract

pytestmark = pytest.mark.django_versions


class TestLocMem(LockContract):
    alias = "locmem"


def test_deploy_check_warns_about_the_process_local_backend() -> None:
    messages = checks.run_checks(include_deployment_checks=True, tags=["distlock"])
    assert [m.id for m in messages if m.obj == "locmem"] == ["distlock.W002"]
    assert not [m for m in checks.run_checks(tags=["distlock"]) if m.obj == "locmem"]
