"""A private Sentinel-managed Redis for one test, which it may fail over: a master,
2 replicas and 3 Sentinels with short timeouts (a failover takes a few seconds),
and a :class:`Gate` between the master and its replicas that can hold back the
replication stream, so that a grant is certainly not on any replica when the
master dies (the shared servers of ``scripts/test`` are never touched)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import redis

from .private_redis import Server, _free_port

SERVICE = "private"
#: Sentinel settings of a quick failover (milliseconds).
DOWN_AFTER_MS = 400
FAILOVER_TIMEOUT_MS = 1500  # also: a failed election is tried again after twice this


class Gate:
    """A TCP relay from a port of its own to the master: the replicas replicate
    through it. :meth:`hold` keeps what the master sends (held, in order) until
    :meth:`open`; :meth:`cut` drops it and closes every connection."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._mutex = threading.Lock()
        self._holding = False
        self._held: list[tuple[socket.socket, bytes]] = []
        self._socks: list[socket.socket] = []
        self._cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                replica, _ = self.listener.accept()
            except OSError:
                return
            try:
                master = socket.create_connection(("127.0.0.1", self.target), timeout=2)
                master.settimeout(None)
            except OSError:
                replica.close()
                continue
            with self._mutex:
                self._socks += [replica, master]
            threading.Thread(target=self._pump, args=(master, replica, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(replica, master, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_master: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                with self._mutex:
                    if self._cut:
                        break
                    if from_master and self._holding:
                        self._held.append((dst, data))
                        continue
                    dst.sendall(data)
        for sock in (src, dst):  # one side closed: so does the other (never flushed)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def hold(self) -> None:
        """From now on, keep the master's bytes back from the replicas."""
        with self._mutex:
            self._holding = True

    def open(self) -> None:
        """Send what was held, in order, and relay again."""
        with self._mutex:
            for dst, data in self._held:
                with contextlib.suppress(OSError):
                    dst.sendall(data)
            self._held, self._holding = [], False

    def cut(self) -> None:
        """Drop what was held and close every connection (the master is gone)."""
        with self._mutex:
            self._cut, self._held = True, []
            socks, self._socks = self._socks, []
        for sock in [*socks, self.listener]:
            with contextlib.suppress(OSError):
                sock.close()


class Gates:
    """The gates of every replica, held, opened or cut together (``each[i]``: replica i's)."""

    def __init__(self, each: list[Gate]) -> None:
        self.each = each

    def hold(self) -> None:
        for gate in self.each:
            gate.hold()

    def open(self) -> None:
        for gate in self.each:
            gate.open()

    def cut(self) -> None:
        for gate in self.each:
            gate.cut()


class Sentinels:
    """A master, 2 replicas (each through a :class:`Gate`) and 3 Sentinels of ``SERVICE``,
    in ``directory``; :meth:`stop` ends them all."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        (directory / "master").mkdir()
        # a replica's first sync starts at once, not after the 5 s Redis 7 waits by
        # default for more replicas to share a diskless transfer
        self.master = Server(directory / "master", ("--repl-diskless-sync-delay", "0"))
        self.replicas: list[Server] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports = [_free_port() for _ in range(3)]
        self.gate = Gates([])
        try:
            self._start()
        except BaseException:
            self.stop()  # what was started, if the set did not come up
            raise

    def _start(self) -> None:
        from .conftest import eventually

        directory = self.directory
        self.master.start()
        self.gate = Gates([Gate(self.master.port) for _ in range(2)])
        for i in range(2):
            (directory / f"replica{i}").mkdir()
            replica = Server(
                directory / f"replica{i}",
                ("--replicaof", "127.0.0.1", str(self.gate.each[i].port)),
            )
            self.replicas.append(replica)
            replica.start()

        assert eventually(self._synced, timeout=15), "the replicas did not sync"
        for i, port in enumerate(self.ports):
            wd = directory / f"sentinel{i}"
            wd.mkdir()
            conf = wd / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {wd}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 2\n"
            )
            argv = ["redis-sentinel", str(conf)] if shutil.which("redis-sentinel") else [
                "redis-server", str(conf), "--sentinel"]
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
        # a failover needs a majority of Sentinels that know each other (hello messages,
        # every 2 s) and know the replicas
        assert eventually(self._acquainted, timeout=20), "the Sentinels did not meet"

    def url(self, query: str = "") -> str:
        """The ``redis+sentinel://`` LOCATION of the set."""
        where = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{where}/{SERVICE}/0" + (f"?{query}" if query else "")

    def sentinel(self, i: int = 0) -> redis.Redis:
        return redis.Redis(port=self.ports[i], socket_timeout=1, decode_responses=True)

    def master_port(self) -> int | None:
        """The master's port as the first Sentinel that answers names it."""
        for i in range(3):
            client = self.sentinel(i)
            try:
                host_port = client.execute_command("SENTINEL get-master-addr-by-name", SERVICE)
                return int(host_port[1])
            except redis.RedisError:
                continue
            finally:
                client.close()
        return None

    def _synced(self) -> bool:
        for replica in self.replicas:
            client = redis.Redis(port=replica.port, socket_timeout=1)
            try:
                if client.info("replication").get("master_link_status") != "up":
                    return False
            finally:
                client.close()
        return True

    def _acquainted(self) -> bool:
        for i in range(3):
            client = self.sentinel(i)
            try:
                info = client.execute_command("SENTINEL MASTER", SERVICE)
            except redis.RedisError:
                return False
            finally:
                client.close()
            if isinstance(info, list):
                info = dict(zip(info[::2], info[1::2], strict=True))
            if int(info["num-other-sentinels"]) < 2 or int(info["num-slaves"]) < 2:
                return False
        return True

    def kill_master(self) -> float:
        """SIGKILL the master; return when (``time.monotonic()``)."""
        self.master.kill()
        return time.monotonic()

    def wait_failover(self, timeout: float = 20) -> float:
        """Wait until the Sentinels name a replica as the master and it says it is one;
        return when (``time.monotonic()``).

        :raises AssertionError: when it does not happen within ``timeout`` seconds.
        """
        from .conftest import eventually

        old = self.master.port
        replicas = {r.port for r in self.replicas}

        def promoted() -> bool:
            port = self.master_port()
            if port not in replicas:
                return False
            client = redis.Redis(port=port, socket_timeout=1)
            try:
                return client.info("replication").get("role") == "master"
            finally:
                client.close()

        assert eventually(promoted, timeout=timeout), f"no failover from port {old}"
        return time.monotonic()

    def wait_replica(self, timeout: float = 20) -> None:
        """Wait until the (new) master has a replica in sync (Sentinel points the
        other replica at it after the failover)."""
        from .conftest import eventually

        def online() -> bool:
            port = self.master_port()
            if port is None:
                return False
            client = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
            try:
                info = client.info("replication")
            except redis.RedisError:
                return False
            finally:
                client.close()
            return any(isinstance(v, dict) and v.get("state") == "online"
                       for k, v in info.items() if k.startswith("slave"))

        assert eventually(online, timeout=timeout), "the new master got no replica in sync"

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(10)
        self.gate.cut()
        for server in (self.master, *self.replicas):
            server.kill()
