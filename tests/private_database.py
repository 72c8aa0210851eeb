"""What the private database servers of the tests share (``private_mariadb.py``,
``private_postgres.py``): a suite's Django alias pointed at one of them for a block, and
a lock backend on it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.utils.module_loading import import_string


@contextlib.contextmanager
def borrowed(alias: str, port: int, **settings: Any) -> Iterator[str]:
    """The suite's Django alias ``alias`` pointed at the server on 127.0.0.1:``port``
    (its database ``distlock``; ``settings``: more of the alias' settings, such as
    ``USER``) while the block runs, its connection closed before and after, the core
    app's migration applied. A test may use only the aliases it was given; the lock
    backends of the block must be new ones (:func:`backend`), whose sessions are opened
    on that server."""
    connection = connections[alias]
    saved = connection.settings_dict
    connection.close()
    # Both the wrapper's and the handler's: a backend's own sessions are new wrappers
    # made from the handler's settings (connections.create_connection).
    here = {**saved, "HOST": "127.0.0.1", "PORT": str(port), "NAME": "distlock", **settings}
    connection.settings_dict = connections.settings[alias] = here
    try:
        executor = MigrationExecutor(connection)
        executor.migrate([("django_distlock", executor.loader.graph.leaf_nodes(
            "django_distlock")[0][1])])
        yield alias
    finally:
        connection.close()
        connection.settings_dict = connections.settings[alias] = saved


def backend(alias: str, mode: str = "lease") -> Any:
    """A database backend in ``mode`` on the Django alias ``alias`` (of :func:`borrowed`)."""
    params = {"BACKEND": "django_distlock.backends.database.DatabaseBackend",
              "OPTIONS": {"DATABASE": alias, "MODE": mode}}
    return import_string(params["BACKEND"])(f"private-{alias}-{mode}", params)
