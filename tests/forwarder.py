"""A TCP forwarder of the tests' own: a slow, lossy or partitioned network on demand.

The kernel here has no ``netem``, so the partition tests put this between a client
and a real server. It listens on ``host`` (127.0.0.1, or the root side of a test
namespace's veth pair) and forwards each accepted connection to ``target``. Its
:attr:`Forwarder.mode` is switched at run time and applies to the connections
already open as well as to new ones:

- ``"pass"``: bytes go through as they come;
- ``"delay"``: each chunk is held ``delay`` seconds in each direction (order kept);
- ``"loss"``: as ``"delay"``, and a chunk is held with probability ``loss`` for a
  random pause of ``stall`` (a ``(low, high)`` range, in seconds) before it goes on.
  TCP cannot lose bytes: a segment lost on the wire is sent again after the
  retransmission timeout (200 ms or more on Linux, doubling each time), and the
  stream stalls behind it. So loss is modelled as those stalls, which is what an
  application sees, rather than as dropped connections (a reset is ``"cut"``);
- ``"blackhole"``: nothing is forwarded either way and the sockets stay open (a
  partition: no reset, no FIN); what was read meanwhile is held, and delivered in
  order once the mode changes back, as TCP retransmissions would deliver it after
  a short partition;
- ``"cut"``: every open connection is closed on both sides, and new ones are
  closed as soon as they are accepted.

A server notices a vanished client only through TCP keepalives, which a server
may set (PostgreSQL's ``tcp_keepalives_*``) and a forwarder would hide: so the
forwarder watches its client side with keepalives of ``peer_timeout`` seconds in
all (``None``: none) and, when they fail (the client's namespace dropping every
packet), closes the server side, as the server's own keepalives would have.
"""

from __future__ import annotations

import contextlib
import queue
import random
import socket
import threading
import time
from typing import Literal

__all__ = ["Forwarder"]

Mode = Literal["pass", "delay", "loss", "blackhole", "cut"]
MODES = ("pass", "delay", "loss", "blackhole", "cut")
CHUNK = 65536


class _Pipe:
    """One direction of one connection: a reader thread queues chunks with the time they
    may leave, a writer thread sends them then (or holds them while blackholed)."""

    def __init__(self, fwd: Forwarder, src: socket.socket, dst: socket.socket, conn: _Conn):
        self.fwd, self.src, self.dst, self.conn = fwd, src, dst, conn
        self.chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()
        self.last = 0.0  # when the last queued chunk may leave: chunks never pass each other
        for target in (self._read, self._write):
            threading.Thread(target=target, daemon=True, name="forwarder").start()

    def _read(self) -> None:
        try:
            while data := self.src.recv(CHUNK):
                self.last = max(self.last, time.monotonic() + self.fwd.hold())
                self.chunks.put((self.last, data))
        except OSError:
            pass
        self.chunks.put((0.0, b""))  # end of stream (or an error): close both sides

    def _write(self) -> None:
        try:
            while True:
                leave, data = self.chunks.get()
                if not data:
                    break
                while (wait := leave - time.monotonic()) > 0 or self.fwd.mode == "blackhole":
                    if self.conn.closed.wait(max(0.005, min(wait, 0.05))):
                        return
                self.dst.sendall(data)
        except OSError:
            pass
        self.conn.close()


class _Conn:
    """Both directions of one forwarded connection."""

    def __init__(self, fwd: Forwarder, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.closed = threading.Event()
        self.pipes = (_Pipe(fwd, client, server, self), _Pipe(fwd, server, client, self))

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class Forwarder:
    """Forward ``host:port`` (``port`` 0: a free one, see :attr:`port`) to ``target``.

    :param target: the real server's ``(host, port)``.
    :param host: the address to listen on.
    :param peer_timeout: seconds of keepalives after which a client that stopped
        answering (a partition) is taken for gone and its server side closed.
    """

    def __init__(
        self, target: tuple[str, int], host: str = "127.0.0.1", port: int = 0,
        peer_timeout: float | None = 3.0,
    ) -> None:
        self.target, self.peer_timeout = target, peer_timeout
        self.mode: Mode = "pass"
        self.delay = 0.0
        self.loss = 0.0
        self.stall: tuple[float, float] = (0.2, 0.6)
        self.rng = random.Random()
        self.conns: list[_Conn] = []
        self._guard = threading.Lock()
        self.listener = socket.create_server((host, port))
        self.host, self.port = self.listener.getsockname()[:2]
        threading.Thread(target=self._accept, daemon=True, name="forwarder-accept").start()

    @property
    def address(self) -> str:
        """``host:port`` to give clients."""
        return f"{self.host}:{self.port}"

    def set(self, mode: Mode, delay: float = 0.0, loss: float = 0.0,
            stall: tuple[float, float] | None = None) -> None:
        """Switch to ``mode`` (see the module's docstring), for open and new connections.

        :param delay: seconds each chunk is held in each direction (``"delay"``, ``"loss"``).
        :param loss: the probability that a chunk stalls (``"loss"``).
        :param stall: the ``(low, high)`` range of a stall's seconds.
        :raises ValueError: for an unknown mode.
        """
        if mode not in MODES:
            raise ValueError(f"Unknown mode {mode!r}; one of {MODES}.")
        self.delay, self.loss = delay, loss
        self.stall = stall or self.stall
        self.mode = mode
        if mode == "cut":
            with self._guard:
                conns, self.conns = self.conns, []
            for conn in conns:
                conn.close()

    def hold(self) -> float:
        """Seconds the chunk read now waits before it goes on (its delay, and any stall)."""
        if self.mode not in ("delay", "loss"):
            return 0.0
        stalled = self.mode == "loss" and self.rng.random() < self.loss
        return self.delay + (self.rng.uniform(*self.stall) if stalled else 0.0)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if self.mode == "cut":
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.peer_timeout:
                _keepalive(client, self.peer_timeout)
            with self._guard:
                self.conns = [c for c in self.conns if not c.closed.is_set()]
                self.conns.append(_Conn(self, client, server))

    def close(self) -> None:
        """Stop listening and close every connection."""
        self.listener.close()
        self.set("cut")


def _keepalive(sock: socket.socket, seconds: float) -> None:
    """Probe a silent peer every third of ``seconds``; give up on it after ``seconds``
    (unacknowledged data, too: ``TCP_USER_TIMEOUT``)."""
    step = max(1, int(seconds / 3))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, step)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, step)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(seconds * 1000))
