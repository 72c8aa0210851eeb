"""Settings of the test suite.

PostgreSQL comes from the ``DISTLOCK_PG_*`` variables that ``scripts/test``
exports after starting the servers; SQLite is a file, so that the worker
processes of the concurrency tests share it.
"""

import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import django.contrib.admin

SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
DEBUG = False
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django_distlock",
    "django_distlock.contrib.admin",
    "django_distlock.contrib.audit",
    "django_distlock.contrib.celery",
    "django_distlock.contrib.schedules",
    "tests.testapp",
    "testproject.shop",
]

DATABASE_ROUTERS = ["tests.routers.DjangoAppsOnDefault", "tests.routers.CacheTablesByName"]

_SQLITE_DIR = os.environ.get("DISTLOCK_SQLITE_DIR") or tempfile.mkdtemp(prefix="distlock-tests-")
_SQLITE_OPTIONS = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_SQLITE_DIR, "default.sqlite3"),
        "OPTIONS": _SQLITE_OPTIONS,
        "TEST": {"NAME": os.path.join(_SQLITE_DIR, "test-default.sqlite3")},
    },
    # No server behind it: the checks must reject it for the database backend.
    "unsupported": {"ENGINE": "django.db.backends.dummy"},
}

PG_AVAILABLE = bool(os.environ.get("DISTLOCK_PG_PORT"))
if PG_AVAILABLE:
    DATABASES["pg"] = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
        "PORT": os.environ["DISTLOCK_PG_PORT"],
        "USER": os.environ.get("DISTLOCK_PG_USER", "postgres"),
        "NAME": os.environ.get("DISTLOCK_PG_NAME", "distlock"),
    }

# MariaDB (started by scripts/test). Its test database keeps the server's usual
# case-insensitive collation on purpose: the lock table's name column must be distinct
# by bytes all the same.
MYSQL_AVAILABLE = bool(os.environ.get("DISTLOCK_MYSQL_PORT"))
if MYSQL_AVAILABLE:
    DATABASES["mysql"] = {
        "ENGINE": "django.db.backends.mysql",
        "HOST": os.environ.get("DISTLOCK_MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ["DISTLOCK_MYSQL_PORT"],
        "USER": os.environ.get("DISTLOCK_MYSQL_USER", "distlock"),
        "NAME": os.environ.get("DISTLOCK_MYSQL_NAME", "distlock"),
        "OPTIONS": {"charset": "utf8mb4"},
        "TEST": {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_general_ci"},
    }

_DB = "django_distlock.backends.database.DatabaseBackend"
DISTLOCK = {
    "default": {"BACKEND": _DB, "TTL": 30, "TIMEOUT": 5},
    "sqlite-lease": {"BACKEND": _DB, "OPTIONS": {"DATABASE": "default"}, "KEY_PREFIX": "l:"},
    "locmem": {"BACKEND": "django_distlock.backends.locmem.LocMemBackend", "TTL": 30},
    "sqlite-tx": {
        "BACKEND": _DB,
        "OPTIONS": {"DATABASE": "default", "MODE": "transaction"},
        "KEY_PREFIX": "t:",
    },
}
if MYSQL_AVAILABLE:
    DISTLOCK["mysql-lease"] = {
        "BACKEND": _DB, "OPTIONS": {"DATABASE": "mysql"}, "KEY_PREFIX": "l:",
    }
    DISTLOCK["mysql-tx"] = {
        "BACKEND": _DB,
        "OPTIONS": {"DATABASE": "mysql", "MODE": "transaction"},
        "KEY_PREFIX": "t:",
    }
    DISTLOCK["mysql-session"] = {
        "BACKEND": _DB,
        "OPTIONS": {"DATABASE": "mysql", "MODE": "session"},
        "KEY_PREFIX": "s:",
    }
if PG_AVAILABLE:
    DISTLOCK["pg-lease"] = {"BACKEND": _DB, "OPTIONS": {"DATABASE": "pg"}, "KEY_PREFIX": "l:"}
    DISTLOCK["pg-tx"] = {
        "BACKEND": _DB,
        "OPTIONS": {"DATABASE": "pg", "MODE": "transaction"},
        "KEY_PREFIX": "t:",
    }
    DISTLOCK["pg-session"] = {
        "BACKEND": _DB,
        "OPTIONS": {"DATABASE": "pg", "MODE": "session"},
        "KEY_PREFIX": "s:",
    }

# Redis (started by scripts/test): the same server through a URL, a django-redis cache
# and Django's own RedisCache; each alias its own KEY_PREFIX. And a 3-master cluster.
REDIS_URL = os.environ.get("DISTLOCK_REDIS_URL", "")
REDIS_CLUSTER_URL = os.environ.get("DISTLOCK_REDIS_CLUSTER_URL", "")
_REDIS = "django_distlock.backends.redis.RedisBackend"
if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "django-redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL},
        "django-builtin": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
        },
    }
    DISTLOCK["redis"] = {"BACKEND": _REDIS, "LOCATION": REDIS_URL, "KEY_PREFIX": "u:"}
    DISTLOCK["redis-cache"] = {
        "BACKEND": _REDIS,
        "OPTIONS": {"CACHE": "django-redis"},
        "KEY_PREFIX": "c:",
    }
    DISTLOCK["redis-djcache"] = {
        "BACKEND": _REDIS,
        "OPTIONS": {"CACHE": "django-builtin"},
        "KEY_PREFIX": "d:",
    }
    # The leanest alias: no arrival order, no listing index.
    DISTLOCK["redis-unfair"] = {
        "BACKEND": _REDIS,
        "LOCATION": REDIS_URL,
        "OPTIONS": {"FAIR": False, "LISTING": False},
        "KEY_PREFIX": "f:",
    }
    # redis-py's query options: replies decoded to str instead of bytes.
    DISTLOCK["redis-decoded"] = {
        "BACKEND": _REDIS,
        "LOCATION": REDIS_URL + "?decode_responses=True",
        "KEY_PREFIX": "s:",
    }
REDLOCK_URLS = os.environ.get("DISTLOCK_REDLOCK_URLS", "")
if REDLOCK_URLS:
    DISTLOCK["redlock"] = {
        "BACKEND": "django_distlock.backends.redis.RedlockBackend",
        "LOCATION": REDLOCK_URLS.split(","),
        "KEY_PREFIX": "r:",
    }
if REDIS_CLUSTER_URL:
    DISTLOCK["redis-cluster"] = {
        "BACKEND": _REDIS,
        "LOCATION": REDIS_CLUSTER_URL,
        "OPTIONS": {"CLUSTER": True},
        "KEY_PREFIX": "k:",
    }

# Locks on a Django cache (docs/cache.md): memcached through PyMemcacheCache, and Django's
# RedisCache; each on its own cache alias, the Redis one with its own KEY_PREFIX.
MEMCACHED = os.environ.get("DISTLOCK_MEMCACHED", "")
_CACHE_LOCKS = "django_distlock.backends.cache.CacheBackend"
if MEMCACHED or REDIS_URL:
    CACHES = globals().get("CACHES") or {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    }
if MEMCACHED:
    CACHES["locks-memcached"] = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": MEMCACHED,
        "KEY_PREFIX": "dl-tests",
    }
    DISTLOCK["cache-memcached"] = {"BACKEND": _CACHE_LOCKS, "OPTIONS": {"CACHE": "locks-memcached"}}
if REDIS_URL:
    CACHES["locks-redis"] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "dl-tests",
    }
    DISTLOCK["cache-redis"] = {"BACKEND": _CACHE_LOCKS, "OPTIONS": {"CACHE": "locks-redis"}}

# Database caches for django_distlock.caching's tests: one table per database, each put
# on its database by tests.routers.CacheTablesByName (created with the test databases).
CACHES = globals().get("CACHES") or {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}
_DB_CACHE = "django.core.cache.backends.db.DatabaseCache"
CACHES["fill-sqlite"] = {"BACKEND": _DB_CACHE, "LOCATION": "distlock_fill_sqlite"}
if PG_AVAILABLE:
    CACHES["fill-pg"] = {"BACKEND": _DB_CACHE, "LOCATION": "distlock_fill_pg"}
if MYSQL_AVAILABLE:
    CACHES["fill-mysql"] = {"BACKEND": _DB_CACHE, "LOCATION": "distlock_fill_mysql"}

# ZooKeeper (started by scripts/test): the 3-node ensemble, and one alias with digest
# auth whose nodes other ZooKeeper clients cannot delete.
ZK_HOSTS = os.environ.get("DISTLOCK_ZK_HOSTS", "")
_ZK = "django_distlock.backends.zookeeper.ZooKeeperBackend"
if ZK_HOSTS:
    DISTLOCK["zk"] = {
        "BACKEND": _ZK,
        "LOCATION": ZK_HOSTS,
        "OPTIONS": {"ROOT": "/distlock-tests", "SESSION_TIMEOUT": 4},
        "KEY_PREFIX": "z:",
    }
    DISTLOCK["zk-auth"] = {
        "BACKEND": _ZK,
        "LOCATION": ZK_HOSTS,
        "OPTIONS": {
            "ROOT": "/distlock-tests-auth",
            "SESSION_TIMEOUT": 4,
            "AUTH": ("distlock", "tests-only"),
        },
    }

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# The admin's CSS and JS, served by the live server of the browser tests (no staticfiles app).
STATIC_URL = "/static/"
STATIC_ROOT = str(Path(django.contrib.admin.__file__).parent / "static")

# Celery (tests/celery_workers.py starts real workers: ``celery -A testproject``): the
# broker and results on the Redis of scripts/test, in a database number of their own
# (11) so they never meet lock keys; each test run consumes a queue of its own.
CELERY_BROKER_URL = os.environ.get("DISTLOCK_CELERY_BROKER_URL") or (
    urlsplit(REDIS_URL)._replace(path="/11").geturl() if REDIS_URL else None
)
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_IMPORTS = ["tests.celery_tasks"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
