"""Models the test suite needs (optimistic locking, fenced writes, admin).

Each topic keeps its models in its own module; ``models.py`` imports them so
Django registers them under this app. The app has no migrations: the test
runner creates its tables directly.
"""
