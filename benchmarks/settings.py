"""Django settings of the benchmarks (``DJANGO_SETTINGS_MODULE=benchmarks.settings``).

PostgreSQL comes from the ``DISTLOCK_PG_*`` variables that ``scripts/bench``
exports; the benchmarks use a database of their own (:data:`BENCH_DB_NAME`,
created on first run next to ``DISTLOCK_PG_NAME``) so they never touch the
tests' data. Redis comes from ``DISTLOCK_REDIS_URL`` (its aliases exist only
when it is set). Only 127.0.0.1 may be a target.
"""

import os
import tempfile

SECRET_KEY = "benchmarks-only-not-secret"
USE_TZ = True
DEBUG = False  # DEBUG=True would record every query in connection.queries
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_distlock", "benchmarks.shopbench"]  # shopbench: the orm suites

#: The database the benchmarks create, migrate and measure in.
BENCH_DB_NAME = os.environ.get("DISTLOCK_BENCH_DB", "distlock_bench")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DISTLOCK_PG_PORT", ""),
        "USER": os.environ.get("DISTLOCK_PG_USER", "postgres"),
        "NAME": BENCH_DB_NAME,
    },
}

# MariaDB or MySQL (benchmarks/mysql.py), from the DISTLOCK_MYSQL_* variables that
# scripts/bench exports: a database of its own, as PostgreSQL's.
if os.environ.get("DISTLOCK_MYSQL_PORT"):
    DATABASES["mysql"] = {
        "ENGINE": "django.db.backends.mysql",
        "HOST": os.environ.get("DISTLOCK_MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ["DISTLOCK_MYSQL_PORT"],
        "USER": os.environ.get("DISTLOCK_MYSQL_USER", "distlock"),
        "NAME": BENCH_DB_NAME,
        "OPTIONS": {"charset": "utf8mb4"},
    }

# Suite ``schedules``: the lease on SQLite too (a fixed path: spawned processes share it).
DATABASES["sqlite"] = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": os.path.join(tempfile.gettempdir(), f"{BENCH_DB_NAME}.sqlite3"),
    "OPTIONS": {"timeout": 30, "init_command": "PRAGMA journal_mode=WAL;"},
}

_DB = "django_distlock.backends.database.DatabaseBackend"
DISTLOCK = {
    "sqlite-lease": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "sqlite"}},
    "pg": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default"}},
    "pg-tx": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default", "MODE": "transaction"}},
    "pg-session": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default", "MODE": "session"}},
    # Suite ``asyncio``: lease mode with more pooled sessions for asyncio tasks (default 16).
    "pg-async64": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default", "ASYNC_SESSIONS": 64}},
    "pg-async4": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default", "ASYNC_SESSIONS": 4}},
    # Suite ``asyncio`` (benchmarks/locmem.py): the process-local backend.
    "locmem": {"BACKEND": "django_distlock.backends.locmem.LocMemBackend"},
}

if "mysql" in DATABASES:
    DISTLOCK["mysql"] = {"BACKEND": _DB, "OPTIONS": {"DATABASE": "mysql"}}
    DISTLOCK["mysql-tx"] = {"BACKEND": _DB, "OPTIONS": {"DATABASE": "mysql", "MODE": "transaction"}}
    DISTLOCK["mysql-session"] = {"BACKEND": _DB,
                                 "OPTIONS": {"DATABASE": "mysql", "MODE": "session"}}

# Redis (benchmarks/redis.py): django-distlock with a pool of its own from a URL, and
# through the pool of a django-redis cache, on the same server as the peers.
REDIS_URL = os.environ.get("DISTLOCK_REDIS_URL", "")
if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL},
    }
    _REDIS = "django_distlock.backends.redis.RedisBackend"
    DISTLOCK["redis"] = {"BACKEND": _REDIS, "LOCATION": REDIS_URL, "TTL": 30}
    DISTLOCK["redis-cache"] = {"BACKEND": _REDIS, "OPTIONS": {"CACHE": "redis"}, "TTL": 30}
    # Suite ``scale.handoff``: 250 waiting threads a process, each in BLPOP on a connection.
    DISTLOCK["redis-1k"] = {
        "BACKEND": _REDIS, "LOCATION": f"{REDIS_URL}?max_connections=300", "TTL": 30
    }
    DISTLOCK["redis-unfair"] = {
        "BACKEND": _REDIS,
        "LOCATION": REDIS_URL,
        "OPTIONS": {"FAIR": False},
        "TTL": 30,
    }
    # the leanest: no arrival order, no listing index (what each costs, side by side)
    DISTLOCK["redis-lean"] = {
        "BACKEND": _REDIS,
        "LOCATION": REDIS_URL,
        "OPTIONS": {"FAIR": False, "LISTING": False},
        "TTL": 30,
    }
# Redis Cluster (scale suites): django-distlock on the cluster scripts/bench starts.
if os.environ.get("DISTLOCK_REDIS_CLUSTER_URL"):
    DISTLOCK["redis-cluster"] = {
        "BACKEND": "django_distlock.backends.redis.RedisBackend",
        "LOCATION": os.environ["DISTLOCK_REDIS_CLUSTER_URL"],
        "OPTIONS": {"CLUSTER": True},
        "TTL": 30,
    }
# Redlock (benchmarks/redlock.py) over the independent masters scripts/bench starts.
REDLOCK_URLS = [url for url in os.environ.get("DISTLOCK_REDLOCK_URLS", "").split(",") if url]
if REDLOCK_URLS:
    DISTLOCK["redlock"] = {
        "BACKEND": "django_distlock.backends.redis.RedlockBackend",
        "LOCATION": REDLOCK_URLS,
        "TTL": 30,
    }
# Redis behind Sentinel (benchmarks/redis_sentinel.py): the master itself, the same
# through its Sentinels, and with every grant waiting for one replica.
SENTINEL_URL = os.environ.get("DISTLOCK_SENTINEL_URL", "")
if SENTINEL_URL and os.environ.get("DISTLOCK_SENTINEL_MASTER_URL"):
    _SENTINEL = {"BACKEND": "django_distlock.backends.redis.RedisBackend", "TTL": 30}
    DISTLOCK["sentinel-direct"] = {
        **_SENTINEL, "LOCATION": os.environ["DISTLOCK_SENTINEL_MASTER_URL"]
    }
    DISTLOCK["sentinel"] = {**_SENTINEL, "LOCATION": SENTINEL_URL}
    DISTLOCK["sentinel-wait1"] = {
        **_SENTINEL, "LOCATION": SENTINEL_URL, "OPTIONS": {"WAIT_REPLICAS": 1}
    }
# ZooKeeper (benchmarks/zookeeper.py): the 3-node ensemble and the standalone server
# scripts/bench starts.
for _alias, _variable in (("zk", "DISTLOCK_ZK_HOSTS"), ("zk1", "DISTLOCK_ZK_STANDALONE")):
    if os.environ.get(_variable):
        DISTLOCK[_alias] = {
            "BACKEND": "django_distlock.backends.zookeeper.ZooKeeperBackend",
            "LOCATION": os.environ[_variable],
            "OPTIONS": {"ROOT": "/distlock-bench-distlock"},  # zookeeper.DISTLOCK_ROOT
        }
# memcached (benchmarks/cache.py): django-distlock's cache backend on a PyMemcacheCache.
MEMCACHED = os.environ.get("DISTLOCK_MEMCACHED", "")
if MEMCACHED:
    CACHES = globals().get("CACHES") or {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    }
    CACHES["memcached"] = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": MEMCACHED,
    }
    DISTLOCK["cache-memcached"] = {
        "BACKEND": "django_distlock.backends.cache.CacheBackend",
        "OPTIONS": {"CACHE": "memcached"},
        "TTL": 30,
    }
