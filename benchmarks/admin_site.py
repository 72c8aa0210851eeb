"""The Django settings the admin benchmarks share: an admin site with the app, its
templates and middleware (``admin_listing``, ``audit_activity`` add their databases and
aliases)."""

from __future__ import annotations

from typing import Any

__all__ = ["admin_settings"]


def admin_settings(**extra: Any) -> dict[str, Any]:
    """Keyword arguments for ``settings.configure()``: the shared admin site, then ``extra``.

    :param extra: more settings (``DATABASES``, ``DISTLOCK``...), overriding the shared ones.
    :returns: the settings.
    """
    return {
        "SECRET_KEY": "bench",
        "USE_TZ": True,
        "ALLOWED_HOSTS": ["testserver"],
        "ROOT_URLCONF": "benchmarks.admin_listing_urls",
        "INSTALLED_APPS": [
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django.contrib.admin",
            "django_distlock",
            "django_distlock.contrib.admin",
            "django_distlock.contrib.audit",
        ],
        "MIDDLEWARE": [
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        "TEMPLATES": [
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
        ],
        "STATIC_URL": "/static/",
        **extra,
    }
