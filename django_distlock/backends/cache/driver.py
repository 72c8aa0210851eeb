"""What the cache backend asks of a cache: the calls each driver makes in one round trip."""

from __future__ import annotations

import abc
from typing import Any

from django.core.cache import InvalidCacheBackendError, caches


class Driver(abc.ABC):
    """The lock calls on one cache alias; every method is one round trip unless it says.

    A *stamp* is what a grant returns and release/extend compare: memcached's CAS value
    of the item (None where the driver compares the owner token itself, on Redis).
    Release and extend also take None for a grant rebuilt from its owner token alone,
    in any process (QueueOnce's worker): they then find the grant's item by that token.
    Every server failure is raised as :class:`~django_distlock.exceptions.BackendUnavailable`.
    """

    def __init__(self, alias: str) -> None:
        #: The ``CACHES`` alias.
        self.alias = alias

    def cache(self) -> Any:
        """This thread's cache object of the alias (Django keeps one per thread).

        :returns: the cache object.
        """
        return caches[self.alias]

    @abc.abstractmethod
    def key(self, lock_key: str) -> str:
        """The cache key of a lock's storage key (the cache's own prefix and version).

        :param lock_key: the backend's storage key of the lock.
        :returns: the key sent to the cache.
        """

    @abc.abstractmethod
    def add(self, key: str, token: str, ttl: float, want_ttl: bool) -> tuple[bool, Any]:
        """Store ``token`` at ``key`` for at least ``ttl`` s unless the key exists.

        :param key: the cache key.
        :param token: the owner token.
        :param ttl: the lease, in seconds.
        :param want_ttl: whether a miss should tell the holder's time left.
        :returns: ``(True, stamp)`` when stored; ``(False, seconds)`` when held, the
            seconds being the holder's time left when ``want_ttl`` (None if unknown).
        """

    @abc.abstractmethod
    def release(self, key: str, token: str, stamp: Any) -> bool:
        """Delete ``key`` only while it still holds this grant.

        :param key: the cache key.
        :param token: the grant's owner token.
        :param stamp: what :meth:`add` or :meth:`extend` returned with the grant, or
            None for a grant rebuilt from its token.
        :returns: whether it deleted the key.
        """

    @abc.abstractmethod
    def extend(self, key: str, token: str, stamp: Any, ttl: float) -> tuple[bool, Any]:
        """Make this grant's key live ``ttl`` s more, only while it holds this grant.

        :param key: the cache key.
        :param token: the owner token.
        :param stamp: the grant's stamp, or None for a grant rebuilt from its token.
        :param ttl: seconds from now.
        :returns: ``(True, new stamp)``, or ``(False, None)`` when the grant is gone.
        """

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether anyone holds ``key``.

        :param key: the cache key.
        :returns: True while the key exists.
        """

    @abc.abstractmethod
    def force_release(self, key: str, owner: str) -> bool:
        """Delete ``key`` if held, only while by the short owner id ``owner`` unless it
        is "" (compared and deleted atomically).

        :param key: the cache key.
        :param owner: a short owner id, or "" for any holder.
        :returns: whether it deleted the key.
        """

    @abc.abstractmethod
    def ping(self) -> None:
        """One round trip to the server."""

    def close(self) -> None:
        """Drop this thread's connections to the cache (they reopen when used); nothing
        when the alias is gone from ``CACHES`` (settings changed)."""
        try:
            cache = caches[self.alias]
        except InvalidCacheBackendError:
            return
        cache.close()
