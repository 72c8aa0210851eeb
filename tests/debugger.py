"""Pause a server's process with gdb as a function it is in returns: a fault at an exact
point of the server's own code, where SIGSTOP from outside cannot aim (a statement's last
microseconds). The process is the real server's; gdb lets it run to that return, keeps it
stopped for a while (timers expire meanwhile: their signals are delivered when it goes
on), and detaches."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from types import TracebackType

import pytest

from .conftest import FULL_RUN

#: Signals that servers use among themselves (latches, cancels, timers): passed on at
#: once, never stopping the process or gdb.
_PASSED = ("SIGALRM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGURG", "SIGTERM", "SIGPIPE")


def require_gdb() -> None:
    """Fail (full run: ``DISTLOCK_SERVERS=1``) or skip when gdb is missing or may not
    attach (it needs root, or ptrace rights over the server's user)."""
    why = None
    if shutil.which("gdb") is None:
        why = "gdb is not installed (scripts/servers.py install adds it)"
    elif os.geteuid() != 0:
        why = "gdb attaches to the servers' processes as root only"
    if why is None:
        return
    if FULL_RUN:
        pytest.fail(f"DISTLOCK_SERVERS=1 but a test that pauses a server cannot run: {why}.")
    pytest.skip(why)


class PauseOnReturn:
    """``with PauseOnReturn(pid, "PortalRun", until=t):`` process ``pid``, which is inside
    a call of the function now, is stopped when that call returns, until ``time.time()``
    reaches ``until`` (at least); gdb then detaches. On leaving, waits for gdb and records
    in ``hit`` whether the return was reached.

    :raises AssertionError: gdb could not attach, or the process is not in the function.
    """

    def __init__(self, pid: int, function: str, until: float) -> None:
        self.pid, self.function, self.until = pid, function, until
        self.hit = False
        self.output = ""
        self._gdb: subprocess.Popen[str] | None = None

    def __enter__(self) -> PauseOnReturn:
        # The pause is the shell's sleep after the return, measured from gdb's start: the
        # return comes later, so the process stays stopped past ``until``.
        pause = max(self.until - time.time(), 0.0)
        handles = [arg for sig in _PASSED for arg in ("-ex", f"handle {sig} nostop noprint pass")]
        self._gdb = subprocess.Popen(
            ["gdb", "-q", "-nx", "-batch", "-p", str(self.pid), *handles,
             "-ex", f"frame function {self.function}", "-ex", "echo RUNNING\\n",
             "-ex", "finish", "-ex", "echo PAUSED\\n", "-ex", f"shell sleep {pause:.3f}",
             "-ex", "detach"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1,
        )
        assert self._gdb.stdout is not None
        seen = []
        for line in self._gdb.stdout:
            seen.append(line)
            if line.startswith("RUNNING"):
                break  # in the frame; ``finish`` lets the process run on, next
        self.output = "".join(seen)
        running = bool(seen) and seen[-1].startswith("RUNNING")
        if not running or f" in {self.function} " not in self.output:
            self._abandon()
            raise AssertionError(f"gdb found no call of {self.function} in {self.pid}:\n"
                                 f"{self.output}")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._gdb is not None
        try:
            rest, _ = self._gdb.communicate(timeout=max(self.until - time.time(), 0) + 30)
        except subprocess.TimeoutExpired:
            rest = self._abandon()  # the call never returned
        self.output += rest
        self.hit = "PAUSED" in rest

    def _abandon(self) -> str:
        """Kill gdb, and wake the process: a process that its tracer left stopped (its
        attach's SIGSTOP) stays stopped."""
        assert self._gdb is not None
        self._gdb.kill()
        rest, _ = self._gdb.communicate()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
        return rest or ""
