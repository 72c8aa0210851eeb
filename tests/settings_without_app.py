"""A site that uses the package (its models import it) but never added the app:
``manage.py check`` must report ``distlock.E005`` (tests/test_checks.py)."""

from .settings import *  # noqa: F403

INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "tests.testapp"]
ROOT_URLCONF = "tests.settings_without_app"
urlpatterns: list[object] = []
DISTLOCK = {"default": {"BACKEND": "django_distlock.backends.database.DatabaseBackend"}}
