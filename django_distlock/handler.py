"""The ``locks`` registry: one backend per ``DISTLOCK`` alias, built lazily per process."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from . import ordering
from .backends.base import BaseLockBackend
from .exceptions import InvalidBackendOptions, InvalidLockAlias, LockConfigurationError

DEFAULT_LOCK_ALIAS = "default"
DATABASE_BACKEND = "django_distlock.backends.database.DatabaseBackend"

#: Backends a forked child inherited: kept referenced, never closed or
#: collected in the child, since closing them would end the parent's sessions.
_inherited: list[BaseLockBackend] = []


class LockHandler:
    """Map aliases of the ``DISTLOCK`` setting to backends, like ``django.core.cache.caches``.

    Backends are shared by the threads of a process (they are thread-safe)
    and rebuilt in a forked child. With no ``DISTLOCK`` setting, ``default``
    is the database backend on the default database.
    """

    def __init__(self) -> None:
        self._mutex = threading.RLock()
        self._backends: dict[str, BaseLockBackend] = {}
        self._settings: dict[str, Mapping[str, Any]] | None = None
        self._pid = os.getpid()

    @property
    def settings(self) -> dict[str, Mapping[str, Any]]:
        """The configured aliases, read from ``settings.DISTLOCK`` on first use."""
        if self._settings is None:
            self._settings = self.configure(getattr(django_settings, "DISTLOCK", None))
        return self._settings

    @staticmethod
    def configure(raw: object) -> dict[str, Mapping[str, Any]]:
        """Return the aliases of a ``DISTLOCK`` value; raise if it is malformed."""
        if raw is None:
            return {DEFAULT_LOCK_ALIAS: {"BACKEND": DATABASE_BACKEND}}
        if not isinstance(raw, Mapping):
            raise LockConfigurationError("DISTLOCK must be a dict of aliases, like CACHES.")
        for alias, params in raw.items():
            if not isinstance(alias, str) or not isinstance(params, Mapping):
                raise LockConfigurationError(
                    f"DISTLOCK[{alias!r}] must be a dict, keyed by a str alias."
                )
        return dict(raw)

    def __getitem__(self, alias: str) -> BaseLockBackend:
        if self._pid != os.getpid():
            self._after_fork()
        backend = self._backends.get(alias)
        if backend is not None:
            return backend
        with self._mutex:
            backend = self._backends.get(alias)
            if backend is None:
                backend = self._backends[alias] = self.create_backend(alias)
            return backend

    def __setitem__(self, alias: str, backend: BaseLockBackend) -> None:
        """Serve ``backend`` for ``alias`` in this process (tests' fault injection, as
        Django's ``connections[alias] = ...``); the one it replaces is not closed."""
        if self._pid != os.getpid():
            self._after_fork()
        with self._mutex:
            self._backends[alias] = backend

    def create_backend(self, alias: str) -> BaseLockBackend:
        """Build the backend of ``alias`` (not cached).

        :raises InvalidLockAlias: if ``alias`` is not configured.
        :raises LockConfigurationError: if its backend won't import or its options are unusable.
        """
        if not isinstance(alias, str):
            raise InvalidLockAlias(f"A lock alias must be a str, not {type(alias).__name__}.")
        try:
            params = self.settings[alias]
        except KeyError:
            raise InvalidLockAlias(
                f"The lock alias {alias!r} is not configured; DISTLOCK has {sorted(self.settings)}."
            ) from None
        path = params.get("BACKEND")
        if not isinstance(path, str):
            raise InvalidBackendOptions(f"DISTLOCK[{alias!r}] needs a 'BACKEND' dotted path.")
        try:
            backend_cls = import_string(path)
        except ImportError as exc:
            raise LockConfigurationError(
                f"DISTLOCK[{alias!r}]['BACKEND'] {path!r} could not be imported: {exc}"
            ) from exc
        if not (isinstance(backend_cls, type) and issubclass(backend_cls, BaseLockBackend)):
            raise LockConfigurationError(
                f"DISTLOCK[{alias!r}]['BACKEND'] {path!r} is not a BaseLockBackend subclass."
            )
        return backend_cls(alias, params)

    @staticmethod
    def check_order() -> str | bool:
        """The lock-order checker's mode (``ordering.py``): ``settings.DISTLOCK_CHECK_ORDER``
        (``"raise"``, ``"warn"`` or False), by default ``"warn"`` under ``DEBUG``.

        :raises LockConfigurationError: for another value.
        """
        mode = getattr(django_settings, "DISTLOCK_CHECK_ORDER", None)
        if mode is None:
            return "warn" if django_settings.DEBUG else False
        if mode not in ("raise", "warn", False):
            raise LockConfigurationError(
                f"DISTLOCK_CHECK_ORDER must be 'raise', 'warn' or False, not {mode!r}."
            )
        return mode

    def __iter__(self) -> Iterator[str]:
        return iter(self.settings)

    def __contains__(self, alias: object) -> bool:
        return alias in self.settings

    def all(self, initialized_only: bool = False) -> list[BaseLockBackend]:
        """Return the backends of every alias (or only those already built)."""
        if initialized_only:
            return list(self._backends.values())
        return [self[alias] for alias in self]

    def close_all(self) -> None:
        """Close every built backend's connections and threads in this process."""
        with self._mutex:
            backends, self._backends = list(self._backends.values()), {}
        for backend in backends:
            backend.close()

    def reset(self) -> None:
        """Forget the settings and close the backends; the next access rebuilds them."""
        self.close_all()
        self._settings = None

    def _after_fork(self) -> None:
        with self._mutex:
            if self._pid != os.getpid():
                _inherited.extend(self._backends.values())
                self._backends = {}
                self._mutex = threading.RLock()
                self._pid = os.getpid()


locks = LockHandler()
ordering.read_mode = LockHandler.check_order


@receiver(setting_changed)
def _reset_locks(*, setting: str, **kwargs: Any) -> None:
    if setting in ("DISTLOCK", "DATABASES"):
        locks.reset()
    if setting in ("DISTLOCK_CHECK_ORDER", "DEBUG"):
        ordering.reset_mode()

