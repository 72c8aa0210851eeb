"""A site that uses the core app only, on Redis (tests/test_checks.py): no contrib app, so
``migrate`` creates the lock tables and nothing of the audit trail. Its SQLite file is
``DISTLOCK_CORE_ONLY_DB``."""

import os

SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_distlock"]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["DISTLOCK_CORE_ONLY_DB"]}
}
DISTLOCK = {
    "default": {
        "BACKEND": "django_distlock.backends.redis.RedisBackend",
        "LOCATION": "redis://127.0.0.1:1/0",  # never called: migrate opens no connection
    }
}
