"""One acquisition on a cache: an atomic add, then a compared release or extend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..base import Acquisition, ExcInfo, Grant, Miss

if TYPE_CHECKING:
    from .backend import CacheBackend


class CacheAcquisition(Acquisition):
    """``attempt()`` is the cache's add; ``wait()`` is the base class' backoff with
    jitter, never past the holder's expiry when the cache told it, nor the deadline.
    Built with a grant's token and never attempted (QueueOnce's worker), it has no
    stamp: the driver compares the token."""

    backend: CacheBackend
    _stamp: Any = None
    _acquired_at: datetime | None = None
    _cache_key: str | None = None

    def _key(self) -> str:
        if self._cache_key is None:  # once per acquisition: the cache's prefix, a digest
            self._cache_key = self.backend.driver().key(self.hold.key)
        return self._cache_key

    def attempt(self) -> Grant | Miss:
        driver = self.backend.driver()
        now = datetime.now(UTC)
        stored, result = driver.add(self._key(), self.token, self.hold.ttl, self.blocking)
        if not stored:
            return Miss(result)
        self._stamp, self._acquired_at = result, now
        return Grant(None, now, now + timedelta(seconds=self.hold.ttl))

    def release(self, exc_info: ExcInfo) -> bool:
        return self.backend.driver().release(self._key(), self.token, self._stamp)

    def extend(self, ttl: float) -> Grant | None:
        driver = self.backend.driver()
        kept, stamp = driver.extend(self._key(), self.token, self._stamp, ttl)
        if not kept:
            return None
        self._stamp = stamp
        return Grant(None, self._acquired_at, datetime.now(UTC) + timedelta(seconds=ttl))
