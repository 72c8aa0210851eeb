"""A private ``redis-server`` for one test, which it may freeze, kill or restart (the
shared servers of ``scripts/test`` are never touched that way)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import redis


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """A ``redis-server`` subprocess of one test (no persistence unless ``options``,
    more command-line options, say so) on a fixed port."""

    def __init__(self, directory: Path, options: tuple[str, ...] = ()) -> None:
        self.directory = directory
        self.options = options
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                *self.options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        from .conftest import eventually  # conftest imports this module for its fixture

        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        try:
            assert eventually(up, timeout=10), "redis-server did not start"
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped server dies too
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def url(self, query: str = "") -> str:
        return f"redis://127.0.0.1:{self.port}/0" + (f"?{query}" if query else "")
