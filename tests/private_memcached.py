"""A private ``memcached`` for one test, which it may restart or fill until it evicts
(the shared server of ``scripts/test`` is never touched that way)."""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

from pymemcache.client.base import Client

from .private_redis import _free_port


class Memcached:
    """``memcached`` (a child process, as user nobody) on a free loopback port, with
    ``megabytes`` of memory (``-m``); :meth:`kill` and :meth:`start` restart it."""

    def __init__(self, megabytes: int = 64) -> None:
        self.megabytes = megabytes
        self.port = _free_port()
        self.location = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("memcached")
        assert binary, "memcached is not installed"
        self.proc = subprocess.Popen(
            [binary, "-l", "127.0.0.1", "-p", str(self.port), "-U", "0", "-u", "nobody",
             "-m", str(self.megabytes)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                Client(("127.0.0.1", self.port), connect_timeout=0.5, timeout=0.5).version()
                return
            except OSError:
                assert self.proc.poll() is None, "the private memcached exited"
                assert time.monotonic() < deadline, "the private memcached did not start"
                time.sleep(0.05)

    def kill(self) -> None:
        """Stop it with SIGKILL (memcached keeps nothing on disk anyway) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def settings(self) -> dict[str, Any]:
        """A ``CACHES`` entry on it."""
        return {"BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
                "LOCATION": self.location}
