"""Packed commands on kept connections: the one place that uses redis-py below its
command layer (``send_packed_command``, ``read_response(timeout=)``, a pool's
``connection_kwargs``), so that the hot path's acquire and release cost one write
and one read and none of redis-py's per-command work. The redis-py versions these
calls are tested with are the ``redis`` extra's range in ``setup.cfg``.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from typing import Any, NamedTuple

from redis.exceptions import ConnectionError, MaxConnectionsError, NoScriptError

from .errors import CLIENT_ERRORS, REDIS_ERRORS

#: Connections the hot path keeps out of the pool between calls (per alias and process):
#: a pool's get and release cost about 7 us a call (a lock, a readiness poll, metrics).
KEPT = 8


class Sent(NamedTuple):
    """Commands written on a connection, their replies not read yet."""

    pool: Any
    conn: Any
    kept: bool  # the connection was kept between calls (it may have been closed)
    payload: bytes
    spare: bool = False  # the call may take a connection outside a full pool
    extra: bool = False  # it did: closed after the call, never kept


class KeptConnections:
    """Up to :data:`KEPT` connections of one alias kept between calls, in this process."""

    def __init__(self) -> None:
        self._kept: deque[Any] = deque()
        self._pid = os.getpid()

    def exchange(
        self, pool: Any, payload: bytes, replies: int, timeout: float | None,
        spare: bool = False,
    ) -> list[Any]:
        """Write ``payload`` (packed commands) and read ``replies`` replies, on a kept
        connection (else the pool's), each read within ``timeout`` seconds (or the
        socket timeout, when shorter). The last reply may raise ``NoScriptError``
        (every reply has been read then: the connection stays in step).

        A kept connection that the server closed while it was kept (a restart, an
        idle timeout) fails at once; the exchange is made again, once, on a new
        connection. Every hot-path script may run twice for one call: a retried
        acquire finds its own grant, a retried extend extends again (redis-py's own
        retries make the same bet on every command).

        ``spare``: a holder's release or extend, which takes one connection outside the
        pool for itself when every connection of the pool is out (waiting threads hold
        theirs in ``BLPOP``): waiters never keep their holder from releasing.

        :raises BackendUnavailable: when Redis fails.
        """
        return self.receive(self.send(pool, payload, spare=spare), replies, timeout)

    def send(self, pool: Any, payload: bytes, fresh: bool = False, spare: bool = False) -> Sent:
        """The first half of :meth:`exchange`: write ``payload`` (on a new connection
        if ``fresh``; outside a full pool if ``spare``); :meth:`receive` reads the
        replies. Between the two, other connections may be written to: the servers
        work in parallel (Redlock).

        :raises BackendUnavailable: when Redis fails.
        """
        conn, kept, extra = None, False, False
        if not fresh:
            if self._pid != os.getpid():  # forked: the kept ones are the parent's
                self._kept, self._pid = deque(), os.getpid()
            with contextlib.suppress(IndexError):  # none kept: a pool's
                conn, kept = self._kept.pop(), True
        while True:
            try:
                if conn is None:
                    conn, extra = _connection(pool, spare)
                conn.send_packed_command([payload], check_health=False)
                return Sent(pool, conn, kept, payload, spare, extra)
            except CLIENT_ERRORS as exc:
                drop(pool, conn)
                if kept and isinstance(exc, ConnectionError):
                    conn, kept = None, False
                    continue
                raise REDIS_ERRORS.translate(exc) from exc
            except BaseException:
                drop(pool, conn)
                raise

    def receive(self, sent: Sent, replies: int, timeout: float | None) -> list[Any]:
        """The second half of :meth:`exchange`.

        :raises BackendUnavailable: when Redis fails.
        """
        pool, conn = sent.pool, sent.conn
        kwargs = pool.connection_kwargs
        given = kwargs.get("socket_timeout", kwargs.get("orig_socket_timeout"))
        if timeout is None or (given and given < timeout):
            read: dict[str, Any] = {}  # the socket timeout
        else:
            read = {"timeout": timeout}
        try:
            got = [conn.read_response(**read) for _ in range(replies - 1)]
            try:
                got.append(conn.read_response(**read))
            except NoScriptError as exc:
                got.append(exc)
        except CLIENT_ERRORS as exc:
            drop(pool, conn)
            if sent.kept and isinstance(exc, ConnectionError):
                return self.receive(self.send(pool, sent.payload, True, sent.spare), replies,
                                    timeout)
            raise REDIS_ERRORS.translate(exc) from exc
        except BaseException:
            drop(pool, conn)  # interrupted mid-reply: the connection is out of step
            raise
        if sent.extra:
            conn.disconnect()
        else:
            self.keep(pool, conn)
        if isinstance(got[-1], NoScriptError):
            raise got[-1]
        return got

    def keep(self, pool: Any, conn: Any) -> None:
        """Keep ``conn`` (in step, idle) for the next call, or give it back to ``pool``."""
        if len(self._kept) < KEPT:
            self._kept.append(conn)
        else:
            pool.release(conn)

    def give_back(self, pool: Any) -> None:
        """Return every kept connection to ``pool`` (none in a forked child: the kept
        ones are the parent's)."""
        kept, self._kept = self._kept, deque()
        if self._pid == os.getpid():
            for conn in kept:
                pool.release(conn)


def _connection(pool: Any, spare: bool) -> tuple[Any, bool]:
    """A connection of ``pool``; with ``spare``, a new one outside it when the pool is
    full (True then: the caller closes it after its call)."""
    try:
        return pool.get_connection(), False
    except MaxConnectionsError:
        if not spare:
            raise
        return pool.connection_class(**pool.connection_kwargs), True


def drop(pool: Any, conn: Any) -> None:
    """Back to the pool, disconnected (the pool reconnects it when needed)."""
    if conn is not None:
        conn.disconnect()
        pool.release(conn)
