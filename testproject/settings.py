"""Settings of the demo shop project.

Service addresses come from the environment only:

- ``DISTLOCK_SQLITE_PATH``: the SQLite file (default: ``db.sqlite3`` in the repo root);
- ``DISTLOCK_PG_PORT``: when set, the ``default`` database is PostgreSQL instead,
  at ``DISTLOCK_PG_HOST`` (127.0.0.1), as ``DISTLOCK_PG_USER`` (postgres), database
  ``DISTLOCK_PG_NAME`` (distlock);
- ``DISTLOCK_DEMO_DATABASE``: ``mysql`` makes the ``default`` database MariaDB or MySQL
  at ``DISTLOCK_MYSQL_HOST`` (127.0.0.1) and ``DISTLOCK_MYSQL_PORT``, as
  ``DISTLOCK_MYSQL_USER`` (distlock), database ``DISTLOCK_MYSQL_NAME`` (distlock);
  ``sqlite`` keeps SQLite even when ``DISTLOCK_PG_PORT`` is set;
- ``DISTLOCK_REDIS_URL``, ``DISTLOCK_ZK_HOSTS``: when set (``scripts/servers.py``
  exports both), the aliases ``redis`` and ``zk`` lock on that Redis server and
  ZooKeeper ensemble, and the flash sale compares them too;
- ``DISTLOCK_CELERY_BROKER_URL``: Celery's broker (default: the Redis of
  ``DISTLOCK_REDIS_URL``, database 11), for ``manage.py flashsale --via celery``.
"""

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent

# A demo project: never deploy these two as they are.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "testproject-demo-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_distlock",
    "django_distlock.contrib.admin",
    "django_distlock.contrib.audit",
    "django_distlock.contrib.celery",
    "django_distlock.contrib.schedules",
    "testproject.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
WSGI_APPLICATION = "testproject.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES: dict[str, dict[str, Any]]
_DEMO_DATABASE = os.environ.get("DISTLOCK_DEMO_DATABASE", "")
if _DEMO_DATABASE == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "HOST": os.environ.get("DISTLOCK_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("DISTLOCK_MYSQL_PORT", "3306"),
            "USER": os.environ.get("DISTLOCK_MYSQL_USER", "distlock"),
            "NAME": os.environ.get("DISTLOCK_MYSQL_NAME", "distlock"),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    }
elif os.environ.get("DISTLOCK_PG_PORT") and _DEMO_DATABASE != "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("DISTLOCK_PG_HOST", "127.0.0.1"),
            "PORT": os.environ["DISTLOCK_PG_PORT"],
            "USER": os.environ.get("DISTLOCK_PG_USER", "postgres"),
            "NAME": os.environ.get("DISTLOCK_PG_NAME", "distlock"),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("DISTLOCK_SQLITE_PATH") or BASE_DIR / "db.sqlite3",
            # Many processes write to this file at once (manage.py flashsale): wait up
            # to 30 s for the write lock instead of failing with "database is locked",
            # and take it at BEGIN, so a transaction never has to upgrade a read lock.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

_DATABASE_BACKEND = "django_distlock.backends.database.DatabaseBackend"
DISTLOCK = {
    # Leases: an autocommit row with an expiry, held across transactions.
    "default": {
        "BACKEND": _DATABASE_BACKEND,
        "OPTIONS": {"DATABASE": "default", "MODE": "lease"},
        "TTL": 60,
        "TIMEOUT": 10,
    },
    # The lock is the row lock of the caller's own transaction.
    "db-tx": {
        "BACKEND": _DATABASE_BACKEND,
        "OPTIONS": {"DATABASE": "default", "MODE": "transaction"},
        "KEY_PREFIX": "tx:",
        "TIMEOUT": 10,
    },
}

if os.environ.get("DISTLOCK_REDIS_URL"):
    DISTLOCK["redis"] = {
        "BACKEND": "django_distlock.backends.redis.RedisBackend",
        "LOCATION": os.environ["DISTLOCK_REDIS_URL"],
        "KEY_PREFIX": "shop:",
        "TIMEOUT": 10,
    }
# The product page's cache (shop/views.py, caching.cached): the Redis of
# DISTLOCK_REDIS_URL in a database number of its own (12), shared by every web worker;
# without it, each process' memory.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": urlsplit(os.environ["DISTLOCK_REDIS_URL"])._replace(path="/12").geturl(),
        "KEY_PREFIX": "shop",
    }
    if os.environ.get("DISTLOCK_REDIS_URL")
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}
# Celery (testproject/celery.py, ``manage.py flashsale --via celery``): the broker from
# DISTLOCK_CELERY_BROKER_URL, else the Redis of DISTLOCK_REDIS_URL in a database number
# of its own (11); none: Celery stays unconfigured (the app still imports).
CELERY_BROKER_URL = os.environ.get("DISTLOCK_CELERY_BROKER_URL") or (
    urlsplit(os.environ["DISTLOCK_REDIS_URL"])._replace(path="/11").geturl()
    if os.environ.get("DISTLOCK_REDIS_URL") else None
)
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

if os.environ.get("DISTLOCK_ZK_HOSTS"):
    DISTLOCK["zk"] = {
        "BACKEND": "django_distlock.backends.zookeeper.ZooKeeperBackend",
        "LOCATION": os.environ["DISTLOCK_ZK_HOSTS"],
        "OPTIONS": {"ROOT": "/distlock-shop"},
        "TIMEOUT": 10,
    }

# django-debug-toolbar with the locks panel (docs/observability.md), when asked for:
# SHOP_DEBUG_TOOLBAR=1 ./manage.py runserver, then /shop/p/<id>/. Off by default, so
# that no other manage.py process of the demo loads the toolbar.
if os.environ.get("SHOP_DEBUG_TOOLBAR") == "1":
    INSTALLED_APPS.append("debug_toolbar")
    MIDDLEWARE.insert(0, "debug_toolbar.middleware.DebugToolbarMiddleware")
    INTERNAL_IPS = ["127.0.0.1"]
    DEBUG_TOOLBAR_PANELS = [  # (the toolbar's own list needs the apps loaded)
        "debug_toolbar.panels.timer.TimerPanel",
        "debug_toolbar.panels.request.RequestPanel",
        "debug_toolbar.panels.sql.SQLPanel",
        "debug_toolbar.panels.cache.CachePanel",
        "django_distlock.contrib.debug_toolbar.LocksPanel",
    ]
    DEBUG_TOOLBAR_CONFIG = {"IS_RUNNING_TESTS": False}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
