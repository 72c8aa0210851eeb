"""Locks on a Django cache alias through its atomic add (memcached, Redis): docs/cache.md."""

from .backend import CacheBackend

__all__ = ["CacheBackend"]
