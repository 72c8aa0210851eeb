"""The optional integrations: the django-health-check 4 check of the lock backends, and
the Prometheus metrics of lock events."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connections
from django.test import RequestFactory, override_settings
from health_check.exceptions import ServiceUnavailable
from health_check.views import HealthCheckView
from prometheus_client import CollectorRegistry

from django_distlock import locks
from django_distlock.contrib import prometheus
from django_distlock.contrib.audit.models import LockEvent
from django_distlock.contrib.health_check import LockBackends
from django_distlock.handle import hold_of

from .conftest import DATABASES, require_pg, require_redis
from .tables import table_missing

# every alias' health() runs, the database ones included (on every test database)
pytestmark = [
    pytest.mark.django_versions,
    pytest.mark.django_db(transaction=True, databases=DATABASES),
]

DOWN = {
    "BACKEND": "django_distlock.backends.redis.RedisBackend",
    "LOCATION": "redis://127.0.0.1:1/0",
}


def _error(check: LockBackends) -> Any:
    """The check's error, run as django-health-check runs it (sync, in an executor)."""
    with ThreadPoolExecutor(1) as pool:
        try:
            return asyncio.run(check.get_result(pool)).error
        finally:  # the thread's database connections, before the test databases go
            pool.submit(connections.close_all).result()
            locks.close_all()


def test_the_health_check_passes_when_the_backends_answer() -> None:
    assert _error(LockBackends(alias="locmem")) is None
    assert _error(LockBackends(alias="default")) is None


def test_the_health_check_names_a_failing_alias_without_its_details(settings: Any) -> None:
    with override_settings(DISTLOCK={**settings.DISTLOCK, "down": DOWN}):
        error = _error(LockBackends())  # every alias
        assert isinstance(error, ServiceUnavailable)
        assert "down" in str(error) and "127.0.0.1" not in str(error)
        assert _error(LockBackends(alias="locmem")) is None  # one alias: the others don't count


def test_the_health_check_in_django_health_checks_view(settings: Any) -> None:
    view = HealthCheckView.as_view(
        checks=[("django_distlock.contrib.health_check.LockBackends", {"alias": "locmem"})]
    )
    response = asyncio.run(view(RequestFactory().get("/ht/", HTTP_ACCEPT="application/json")))
    assert response.status_code == 200
    with override_settings(DISTLOCK={**settings.DISTLOCK, "down": DOWN}):
        view = HealthCheckView.as_view(
            checks=[("django_distlock.contrib.health_check.LockBackends", {"alias": "down"})]
        )
        response = asyncio.run(view(RequestFactory().get("/ht/", HTTP_ACCEPT="application/json")))
    assert response.status_code == 500


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    prometheus.install(registry)
    yield registry
    prometheus.uninstall()


def test_prometheus_counts_lock_events(registry: CollectorRegistry, unique: Any) -> None:
    backend = locks["locmem"]
    name = unique()
    with backend.lock(name):
        assert backend.lock(name).acquire(blocking=False) is False
    handle = backend.lock(name)
    assert handle.acquire()
    backend.force_release(name)
    hold_of(handle).mark_lost()
    labels = {"alias": "locmem"}

    def value(metric: str) -> float | None:
        return registry.get_sample_value(metric, labels)

    assert value("distlock_acquisitions_total") == 2
    assert value("distlock_acquire_failures_total") == 1
    assert value("distlock_force_releases_total") == 1
    assert value("distlock_lost_total") == 1
    assert value("distlock_wait_seconds_count") == 3
    assert value("distlock_hold_seconds_count") == 1
    assert prometheus.install(registry) is prometheus.install()  # installed once


def test_prometheus_counts_acquires_that_raised(registry: CollectorRegistry, unique: Any
                                                ) -> None:
    require_redis()
    from django_distlock.exceptions import BackendUnavailable
    from django_distlock.testing import backend_unavailable

    with backend_unavailable("redis") as broken, pytest.raises(BackendUnavailable):
        broken.lock(unique(), timeout=1).acquire()
    labels = {"alias": "redis"}
    assert registry.get_sample_value("distlock_acquire_errors_total", labels) == 1
    assert registry.get_sample_value("distlock_acquire_failures_total", labels) in (None, 0)
    assert registry.get_sample_value("distlock_wait_seconds_count", labels) == 1


def test_prometheus_uninstalled_counts_nothing(unique: Any) -> None:
    registry = CollectorRegistry()
    prometheus.install(registry)
    prometheus.uninstall()
    with locks["locmem"].lock(unique()):
        pass
    assert registry.get_sample_value("distlock_acquisitions_total", {"alias": "locmem"}) is None


def test_the_health_check_fails_without_the_lock_or_the_audit_table(settings: Any) -> None:
    """Where ``migrate`` never ran every acquire fails: so must the check."""
    require_pg()
    audited = {"BACKEND": "django_distlock.backends.locmem.LocMemBackend", "AUDIT": True}
    with override_settings(DISTLOCK={**settings.DISTLOCK, "audited": audited}):
        assert _error(LockBackends(alias="pg-lease")) is None
        assert _error(LockBackends(alias="audited")) is None
        with table_missing("pg", "django_distlock_lock"):
            for alias in ("pg-lease", "pg-tx"):
                assert isinstance(_error(LockBackends(alias=alias)), ServiceUnavailable)
            assert _error(LockBackends(alias="audited")) is None
        with table_missing("default", LockEvent._meta.db_table):
            assert isinstance(_error(LockBackends(alias="audited")), ServiceUnavailable)
        assert _error(LockBackends()) is None
