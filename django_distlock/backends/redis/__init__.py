"""The Redis lock backend: see :class:`~.backend.RedisBackend` and ``docs/redis.md``."""

from .backend import RedisBackend

__all__ = ["RedisBackend"]
