"""The Redis backend through Django: the shipped contract on a django-redis cache and on
Django's own RedisCache (``OPTIONS["CACHE"]``), and the system checks of an alias. The
rest of the backend, decided by Redis and our scripts, is ``test_backend_redis.py``
(single tier: CONTRIBUTING.md, "The tiers")."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_distlock import locks
from django_distlock.exceptions import LockConfigurationError
from django_distlock.testing import LockContract

from .conftest import require_redis

pytestmark = pytest.mark.django_versions


class RedisContract(LockContract):
    @pytest.fixture(autouse=True)
    def _redis(self) -> None:
        require_redis()


class TestRedisDjangoRedisCache(RedisContract):
    alias = "redis-cache"


class TestRedisDjangoCache(RedisContract):
    alias = "redis-djcache"


@pytest.mark.parametrize(
    ("cache", "message"),
    [("missing", "not a cache alias"), ("default", "not Redis")],
)
def test_the_checks_name_a_cache_that_cannot_be_used(cache: str, message: str) -> None:
    require_redis()
    alias = {"BACKEND": "django_distlock.backends.redis.RedisBackend", "OPTIONS": {"CACHE": cache}}
    with override_settings(DISTLOCK={"default": alias}):
        from django_distlock.checks import check_distlock

        (error,) = check_distlock()
        assert error.id == "distlock.E010" and message in error.msg
        with pytest.raises(LockConfigurationError, match=message):
            locks["default"].lock("x").acquire()


def test_the_aliases_pass_the_checks() -> None:
    require_redis()
    call_command("check")
