"""Locks on memcached through a ``PyMemcacheCache`` alias: an add, a compared delete.

Why meta commands and not only ``add``/``gets``/``cas``: the text protocol's
``cas`` can only overwrite, never delete, so a release would be a ``gets``, a
comparison and a ``delete`` in separate steps (another owner may take the key
between them: the unsafe release of the classic recipe), or a tombstone left in
the key. Memcached 1.6's ``ms`` in add mode (``ME``) returns the item's CAS value
with the grant, and ``md ... C<cas>`` deletes only while the item still has that
CAS value; ``ms ... C<cas>`` re-stores it with a new TTL (extend) likewise.

A CAS value names one version of one item only within one server process: a
restarted memcached counts CAS values from 1 again, so a new owner's item may get
the very number an old grant holds. The driver therefore trusts a grant's CAS
value alone only on the TCP connection it came on (a restarted server cannot
answer on a connection of the old process): then acquire and release are one
round trip each, like a raw add/delete pair. On any other connection (another
thread, a reconnect), and for a grant rebuilt from its owner token alone (no CAS
value: QueueOnce's worker releases the enqueuer's grant), it first reads the item
with ``gets`` (value and CAS in one reply), compares the owner token, then deletes
or re-stores with that CAS value.

Granularity: memcached counts TTLs in whole seconds on a clock that ticks once a
second, so an item stored with ``T<n>`` lives between ``n - 1`` and ``n`` seconds.
A ``ttl`` is sent as ``ceil(ttl) + 1``: the lease lasts at least ``ttl`` on the
server (the handle counts ``ttl``), and up to 2 s more.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, NoReturn

from pymemcache.exceptions import MemcacheUnknownCommandError

from ...exceptions import BackendUnavailable, UnsupportedOperation
from ...values import short_owner
from .driver import Driver
from .errors import CACHE_ERRORS, MEMCACHED_ERRORS

#: Memcached takes a relative TTL of at most 30 days (longer is read as a Unix time).
MAX_TTL = 30 * 24 * 3600
#: A key memcached takes as it is: printable ASCII, no space, at most 250 bytes.
PLAIN_KEY = re.compile(r"[\x21-\x7e]{1,250}")
#: Seconds a call waits on its socket (to connect, and for each read) when the cache's
#: ``OPTIONS`` set no ``timeout``: pymemcache's default waits forever, so a partitioned
#: server held a release for as long as TCP kept retrying (minutes). redis-py 8's default.
DEFAULT_TIMEOUT = 5.0


@dataclass(slots=True)  # not frozen: a frozen dataclass' __init__ costs 1 µs a grant
class Stamp:
    """A grant's CAS value and the connection it came on (whose thread and process);
    never changed once made."""

    cas: int | None
    client: Any
    sock: Any
    thread: int
    pid: int

    def same_connection(self) -> bool:
        """Whether this thread of this process still talks on the granting socket.

        :returns: True when the grant's CAS value alone identifies its item.
        """
        return (
            self.sock is not None and getattr(self.client, "sock", None) is self.sock
            and self.thread == threading.get_ident() and self.pid == os.getpid()
        )


def _bound_waits(client: Any) -> None:
    """Give a pymemcache client that would wait forever :data:`DEFAULT_TIMEOUT` instead."""
    client.timeout = DEFAULT_TIMEOUT
    if getattr(client, "connect_timeout", 0) is None:
        client.connect_timeout = DEFAULT_TIMEOUT
    if getattr(client, "sock", None) is not None:
        client.sock.settimeout(DEFAULT_TIMEOUT)


def server_ttl(ttl: float) -> int:
    """The ``T`` flag that keeps an item at least ``ttl`` seconds (see the module doc).

    :param ttl: the lease, in seconds.
    :returns: whole seconds, ``ceil(ttl) + 1``.
    :raises UnsupportedOperation: past memcached's 30 days.
    """
    seconds = math.ceil(ttl) + 1
    if seconds > MAX_TTL:
        raise UnsupportedOperation(
            f"memcached keeps an item at most 30 days; a lock on it takes a ttl of at most "
            f"{MAX_TTL - 1} s, got {ttl}."
        )
    return seconds


class MemcachedDriver(Driver):
    """Lock calls on a ``PyMemcacheCache`` alias (memcached 1.6 or later); a grant's
    stamp is a :class:`Stamp`."""

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        #: ``(thread id, cache)`` that :meth:`key` looked up, for the call that follows it
        #: in the same thread (a grant's first attempt): ``caches[alias]`` once, not twice.
        self._looked_up: tuple[int, Any] | None = None

    def key(self, lock_key: str) -> str:
        cache = self.cache()
        key: str = cache.make_key("distlock:" + lock_key)
        if not PLAIN_KEY.fullmatch(key):
            digest = hashlib.sha256(lock_key.encode("utf-8", "surrogatepass")).hexdigest()
            key = cache.make_key("distlock:#" + digest)
        self._looked_up = (threading.get_ident(), cache)
        return key

    def _client(self, key: str) -> tuple[Any, Any]:
        """This thread's cache and the pymemcache client of ``key``'s server."""
        looked_up, self._looked_up = self._looked_up, None
        if looked_up is not None and looked_up[0] == threading.get_ident():
            cache = looked_up[1]  # what caches[alias] gave this thread just now, in key()
        else:
            cache = self.cache()
        if getattr(cache, "_distlock_pid", None) != os.getpid():
            cache.close()  # a forked child: never share the parent's sockets
            cache._distlock_pid = os.getpid()
        hash_client = cache._cache
        servers = getattr(hash_client, "clients", None)
        if servers is not None and len(servers) == 1:
            client = next(iter(servers.values()))  # one server: no hashing (pure Python)
        elif hasattr(hash_client, "_get_client"):
            # HashClient picks the key's server (its public calls have no raw command).
            client = hash_client._get_client(key)
        else:
            client = hash_client
        if client is None:
            raise BackendUnavailable(f"memcached (cache {self.alias!r}): no server is up")
        if getattr(client, "timeout", 0) is None:
            _bound_waits(client)
        return cache, client

    def _call(self, key: str, command: str, client: Any = None) -> list[str]:
        """Send one meta command to ``key``'s server; its reply line, split."""
        if client is None:
            client = self._client(key)[1]
        try:
            reply: bytes = client.raw_command(command)
        except MEMCACHED_ERRORS as exc:
            self._failed(client, exc)
        return reply.decode("ascii", "replace").split()

    def _guarded(self, client: Any, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except MEMCACHED_ERRORS as exc:
            self._failed(client, exc)

    def _failed(self, client: Any, exc: BaseException) -> NoReturn:
        """Raise what a failed call on ``client`` means (:data:`.errors.CACHE_ERRORS`),
        closing it if the server failed (not if it only lacked a command)."""
        if not isinstance(exc, MemcacheUnknownCommandError):
            client.close()
        raise CACHE_ERRORS.translate(exc, where=self.alias) from exc

    def _own_cas(self, key: str, client: Any, token: str | None, owner: str = "") -> Any:
        """``gets``: the item's CAS value if it holds ``token`` (or, ``token`` None, an
        owner id starting with ``owner``); else None."""
        value, cas = self._guarded(client, client.gets, key)
        if not isinstance(value, bytes) or cas is None:
            return None
        held = value.decode("ascii", "replace")
        matches = held == token if token is not None else short_owner(held).startswith(owner)
        if not matches:
            return None
        return cas.decode() if isinstance(cas, bytes) else cas

    @staticmethod
    def _flag(reply: list[str], name: str) -> int | None:
        for part in reply[1:]:
            if part.startswith(name):
                return int(part[1:])
        return None

    def add(self, key: str, token: str, ttl: float, want_ttl: bool) -> tuple[bool, Any]:
        client = self._client(key)[1]
        reply = self._call(key, f"ms {key} {len(token)} T{server_ttl(ttl)} ME c\r\n{token}",
                           client)
        if reply[0] == "HD":
            return True, self._stamp(reply, client)
        if not want_ttl:
            return False, None
        # A second round trip, on a miss of a waiting acquire only: how long the holder
        # has left bounds the wait (whole seconds: the server's granularity).
        left = self._call(key, f"mg {key} t", client)
        if left[0] == "EN":
            return False, 0.0
        seconds = self._flag(left, "t")
        return False, None if seconds is None or seconds < 0 else float(seconds)

    def _stamp(self, reply: list[str], client: Any) -> Stamp:
        return Stamp(self._flag(reply, "c"), client, getattr(client, "sock", None),
                     threading.get_ident(), os.getpid())

    def _cas_of_grant(self, key: str, token: str, stamp: Stamp | None) -> tuple[Any, Any]:
        """The client to use and the CAS value to compare (None: not this grant's);
        ``stamp`` is None for a grant rebuilt from its token (QueueOnce's worker)."""
        if stamp is not None and stamp.same_connection():
            # The same connection, so the same server process: its CAS values never
            # repeat, and the grant's names this grant's item only. One round trip.
            return stamp.client, stamp.cas
        client = self._client(key)[1]
        return client, self._own_cas(key, client, token)

    def release(self, key: str, token: str, stamp: Any) -> bool:
        client, cas = self._cas_of_grant(key, token, stamp)
        return cas is not None and self._call(key, f"md {key} C{cas}", client)[0] == "HD"

    def extend(self, key: str, token: str, stamp: Any, ttl: float) -> tuple[bool, Any]:
        client, cas = self._cas_of_grant(key, token, stamp)
        if cas is None:
            return False, None
        command = f"ms {key} {len(token)} T{server_ttl(ttl)} C{cas} c\r\n{token}"
        reply = self._call(key, command, client)
        if reply[0] == "HD":
            return True, self._stamp(reply, client)
        return False, None

    def exists(self, key: str) -> bool:
        return self._call(key, f"mg {key}")[0] == "HD"

    def force_release(self, key: str, owner: str) -> bool:
        if not owner:
            return self._call(key, f"md {key}")[0] == "HD"
        client = self._client(key)[1]
        cas = self._own_cas(key, client, None, owner)
        # Deleted only while the item is still the one read (a new grant: another CAS).
        return cas is not None and self._call(key, f"md {key} C{cas}", client)[0] == "HD"

    def ping(self) -> None:
        if self._call("distlock:ping", "mn")[0] != "MN":
            raise BackendUnavailable(f"memcached (cache {self.alias!r}) answered no MN")
