"""The cache backend (locks on a Django cache through its atomic add) against the real
memcached and Redis that scripts/test starts: the shipped contract on both, mutual
exclusion of forked processes, crashes, expiry, restarts, eviction and refusals."""

from __future__ import annotations

import pytest

from django_distlock.testing import LockContract

from .conftest import require_memcached, require_redis


class TestCacheMemcached(LockContract):
    alias = "cache-memcached"

    @pytest.fixture(autouse=True)
    def _server(self) -> None:
        require_memcached()


class TestCacheRedis(LockContract):
    alias = "cache-redis"

    @pytest.fixture(autouse=True)
    def _server(self) -> None:
        require_redis()
