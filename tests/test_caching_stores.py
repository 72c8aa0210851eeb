"""``django_distlock.caching``'s fenced write on every cache kind's real server: a value
built under an earlier grant never replaces one built under a later grant. It reaches
into Django's cache classes (the database cache's table, the Redis and memcached
clients): every Django env runs it."""

from __future__ import annotations

import time

import pytest
from django.core.cache import caches
from django.test import override_settings

from django_distlock.caching import entry, stores

from .conftest import LIBRARY_DB, require_memcached, require_mysql, require_pg, require_redis

pytestmark = [pytest.mark.django_versions, LIBRARY_DB]


def _cache(alias: str) -> str:
    if alias in ("django-redis", "django-builtin"):
        require_redis()
    elif alias == "locks-memcached":
        require_memcached()
    elif alias == "fill-pg":
        require_pg()
    elif alias == "fill-mysql":
        require_mysql()
    return alias


CACHE_KINDS = ["default", "django-redis", "django-builtin", "locks-memcached", "fill-sqlite",
               "fill-pg", "fill-mysql"]


@pytest.mark.parametrize("alias", CACHE_KINDS)
def test_a_write_under_an_earlier_grant_is_dropped(alias: str, unique) -> None:
    cache = caches[_cache(alias)]
    assert stores.atomic(cache)
    key = unique("fenced")
    later = entry.pack("later", time.time() + 60, 0.1, "redis", 7)
    earlier = entry.pack("earlier", time.time() + 60, 0.1, "redis", 5)
    assert stores.write(cache, key, None, later, 60) is True
    assert stores.write(cache, key, None, earlier, 60) is False
    assert cache.get(key)[1] == "later"
    # The same grant, a later one, or another alias' tokens: written.
    assert stores.write(cache, key, None, entry.pack("same", None, 0, "redis", 7), 60)
    assert stores.write(cache, key, None, entry.pack("next", None, 0, "redis", 9), 60)
    assert stores.write(cache, key, None, entry.pack("zk's", None, 0, "zk", 1), 60)
    assert cache.get(key)[1] == "zk's"
    # A missing key: the first writer adds it.
    other = unique("fresh")
    assert stores.write(cache, other, None, earlier, 60) is True
    assert cache.get(other)[1] == "earlier"


def test_fenced_writes_keep_the_caches_expiry(unique) -> None:
    key = unique("expiring")
    kinds = [caches[_cache(alias)] for alias in CACHE_KINDS]
    for cache in kinds:
        assert stores.write(cache, key, None, entry.pack("v", None, 0, "redis", 1), 1)
        assert cache.get(key)[1] == "v"
    time.sleep(2.1)  # once for all: memcached and the database cache count whole seconds
    assert [cache.get(key) for cache in kinds] == [None] * len(kinds)


def test_a_cache_without_compare_falls_back_and_says_so(tmp_path, unique) -> None:
    with override_settings(CACHES={"files": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": str(tmp_path),
    }}):
        cache = caches["files"]
        assert not stores.atomic(cache)
        key = unique("file")
        assert stores.write(cache, key, None, entry.pack("later", None, 0, "x", 7), 60)
        assert not stores.write(cache, key, None, entry.pack("earlier", None, 0, "x", 5), 60)
