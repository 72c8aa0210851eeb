"""Locks on memcached through a ``PyMemcacheCache`` alias, with the meta commands.

Why meta commands and not ``add``/``gets``/``cas``: the text protocol's ``cas``
can only overwrite, never delete, so a release would be a ``gets``, a comparison
and a ``delete`` in three steps (another owner may take the key between them: the
unsafe release of the classic recipe), or a tombstone left in the key. Memcached
1.6's ``ms`` in add mode (``ME``) returns the item's CAS value with the grant, and
``md ... C<cas>`` deletes only while the item still has that CAS value: a lock
taken by anyone else (after an expiry, an eviction, a force release) has another
one. So acquire is one round trip and release one, as a raw add/delete pair;
extend is ``ms ... C<cas>`` (a compare-and-set with a new TTL). The calls go
through the cache's own pymemcache client for the key's server.

Granularity: memcached counts TTLs in whole seconds on a clock that ticks once a
second, so an item stored with ``T<n>`` lives between ``n - 1`` and ``n`` seconds.
A ``ttl`` is sent as ``ceil(ttl) + 1``: the lease lasts at least ``ttl`` on the
server (the handle counts ``ttl``), and up to 2 s more.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

from pymemcache.exceptions import MemcacheError, MemcacheUnknownCommandError

from ...exceptions import BackendUnavailable, LockConfigurationError, UnsupportedOperation
from ...values import short_owner
from .driver import Driver

#: Memcached takes a relative TTL of at most 30 days (longer is read as a Unix time).
MAX_TTL = 30 * 24 * 3600
#: Longest memcached key, in bytes.
MAX_KEY = 250


def server_ttl(ttl: float) -> int:
    """The ``T`` flag that keeps an item at least ``ttl`` seconds (see the module doc).

    :raises UnsupportedOperation: past memcached's 30 days.
    """
    seconds = math.ceil(ttl) + 1
    if seconds > MAX_TTL:
        raise UnsupportedOperation(
            f"memcached keeps an item at most 30 days; a lock on it takes a ttl of at most "
            f"{MAX_TTL - 1} s, got {ttl}."
        )
    return seconds


def _owner_flags(token: str) -> int:
    # The short owner id (8 hex digits, 32 bits) rides in the item's client flags, so
    # a force release by owner reads it with the CAS value in one single-line reply.
    try:
        return int(short_owner(token), 16)
    except ValueError:
        return 0


class MemcachedDriver(Driver):
    """Lock calls on a ``PyMemcacheCache`` alias (memcached 1.6 or later)."""

    def key(self, lock_key: str) -> str:
        key: str = self.cache().make_key("distlock:" + lock_key)
        if len(key) > MAX_KEY or not key.isascii() or any(c <= " " or c == "\x7f" for c in key):
            digest = hashlib.sha256(lock_key.encode("utf-8", "surrogatepass")).hexdigest()
            key = self.cache().make_key("distlock:#" + digest)
        return key

    def _call(self, key: str, command: str) -> list[str]:
        """Send one meta command to ``key``'s server; its reply line, split."""
        cache = self.cache()
        if getattr(cache, "_distlock_pid", None) != os.getpid():
            cache.close()  # a forked child: never share the parent's sockets
            cache._distlock_pid = os.getpid()
        hash_client = cache._cache
        try:
            # HashClient picks the key's server (its public calls have no raw command).
            client = hash_client._get_client(key) if hasattr(hash_client, "_get_client") \
                else hash_client
            if client is None:
                raise MemcacheError("no memcached server is up for this key")
            reply: bytes = client.raw_command(command)
        except MemcacheUnknownCommandError as exc:
            raise LockConfigurationError(
                f"CACHES[{self.alias!r}]: the memcached server does not know the meta "
                "commands; the cache lock backend needs memcached 1.6 or later."
            ) from exc
        except (MemcacheError, OSError) as exc:
            cache.close()
            raise BackendUnavailable(f"memcached (cache {self.alias!r}) failed: {exc}") from exc
        return reply.decode("ascii", "replace").split()

    @staticmethod
    def _flag(reply: list[str], name: str) -> int | None:
        for part in reply[1:]:
            if part.startswith(name):
                return int(part[1:])
        return None

    def add(self, key: str, token: str, ttl: float, want_ttl: bool) -> tuple[bool, Any]:
        flags = _owner_flags(token)
        reply = self._call(
            key, f"ms {key} {len(token)} T{server_ttl(ttl)} F{flags} ME c\r\n{token}"
        )
        if reply[0] == "HD":
            return True, self._flag(reply, "c")
        if not want_ttl:
            return False, None
        # A second round trip, on a miss of a waiting acquire only: how long the holder
        # has left bounds the wait (whole seconds: the server's granularity).
        left = self._call(key, f"mg {key} t")
        if left[0] == "EN":
            return False, 0.0
        seconds = self._flag(left, "t")
        return False, None if seconds is None or seconds < 0 else float(seconds)

    def release(self, key: str, token: str, stamp: Any) -> bool:
        return self._call(key, f"md {key} C{stamp}")[0] == "HD"

    def extend(self, key: str, token: str, stamp: Any, ttl: float) -> tuple[bool, Any]:
        flags = _owner_flags(token)
        reply = self._call(
            key, f"ms {key} {len(token)} T{server_ttl(ttl)} F{flags} C{stamp} c\r\n{token}"
        )
        if reply[0] == "HD":
            return True, self._flag(reply, "c")
        return False, None

    def exists(self, key: str) -> bool:
        return self._call(key, f"mg {key}")[0] == "HD"

    def force_release(self, key: str, owner: str) -> bool:
        if not owner:
            return self._call(key, f"md {key}")[0] == "HD"
        reply = self._call(key, f"mg {key} f c")
        if reply[0] != "HD":
            return False
        if not f"{self._flag(reply, 'f') or 0:08x}".startswith(owner):
            return False
        # Deleted only while the item is still the one read (a new grant: another CAS).
        return self._call(key, f"md {key} C{self._flag(reply, 'c')}")[0] == "HD"

    def ping(self) -> None:
        if self._call("distlock:ping", "mn")[0] != "MN":
            raise BackendUnavailable(f"memcached (cache {self.alias!r}) answered no MN")
