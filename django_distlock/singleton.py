"""The singleton runner: a command run as a child process only while this process leads.

``manage.py distlock singleton beat -- celery -A proj beat`` on every host: each runner
campaigns for leadership ``beat`` (``leadership.py``); the one that leads starts the
command, the others wait. The leader's child is stopped (SIGTERM to its process group,
SIGKILL after ``grace``) *before* the term can pass to another: when the lease has
``grace`` + :data:`KILL_MARGIN` seconds left without a renewal, or at once when the
term is lost (a renewal found it gone, a ZooKeeper session suspended). The runner then
campaigns again. The child is started through ``deathsig.py``, which has Linux SIGKILL
it when the runner dies, even by SIGKILL. The child finds its term's epoch in
``DISTLOCK_EPOCH`` (and the name in ``DISTLOCK_LEADER``): its writes may carry it.

What it cannot do: stop a child while the runner itself is paused (SIGSTOP, a frozen
VM) — the child runs on, and another runner's child may start once the lease ends;
only the epoch, checked by storage, refuses the deposed child's writes. Nor does the
parent-death signal reach the child's own children (Celery beat has none).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from .exceptions import UnsupportedOperation
from .handler import DEFAULT_LOCK_ALIAS, locks
from .leadership import Leader, Term, notice
from .values import DEFAULT, _Default, validate_ttl

if TYPE_CHECKING:
    pass

__all__ = ["EPOCH_ENV", "KILL_MARGIN", "LEADER_ENV", "run_singleton"]

#: The child's environment: its term's epoch, and the leadership's name.
EPOCH_ENV = "DISTLOCK_EPOCH"
LEADER_ENV = "DISTLOCK_LEADER"
#: Seconds kept between the child's SIGKILL and the end of the lease on this clock.
KILL_MARGIN = 0.5
_DEATHSIG = Path(__file__).with_name("deathsig.py")


def run_singleton(
    name: str,
    command: Sequence[str],
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | _Default = DEFAULT,
    grace: float = 5.0,
    say: Callable[[str], object] | None = None,
) -> int:
    """Run ``command`` while this process leads ``name``, for as long as it runs; campaign
    again whenever leadership is lost. Call it from the main thread (it sets SIGTERM's and
    SIGINT's handlers: either stops the child, ends the term and returns).

    :param name: the leadership's name.
    :param command: the program and its arguments (looked up on ``PATH``).
    :param using: a ``DISTLOCK`` alias that ``supports_leadership``.
    :param ttl: the term's lease (default: the alias' ``TTL``); a runner SIGKILLed (with
        its child) is replaced within it. ZooKeeper: its session timeout instead.
    :param grace: seconds between the child's SIGTERM and its SIGKILL; ``grace`` +
        :data:`KILL_MARGIN` must fit in a third of the ``ttl`` (ZooKeeper: of its
        ``SESSION_TIMEOUT``), the time a term's end is known ahead.
    :param say: called with a line for each thing the runner does (default: stderr).
    :returns: the child's exit status when it ended by itself or was stopped by a
        signal to the runner (128 + N for a child ended by signal N).
    :raises UnsupportedOperation: off Linux, outside the main thread, or on a backend
        that cannot lead.
    :raises TypeError, ValueError: for a bad command, ``ttl`` or ``grace``.
    """
    if not sys.platform.startswith("linux"):
        raise UnsupportedOperation(
            "The singleton runner needs Linux's parent-death signal (prctl "
            "PR_SET_PDEATHSIG) so that its child dies with it."
        )
    if threading.current_thread() is not threading.main_thread():
        raise UnsupportedOperation(
            "run_singleton() must run in the main thread: it handles SIGTERM and SIGINT, "
            "and its child dies when the thread that started it ends."
        )
    if isinstance(command, str) or not command or not all(
        isinstance(arg, str) for arg in command
    ):
        raise TypeError("command must be a non-empty list of str (the program, then its args).")
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not grace > 0:
        raise ValueError(f"grace must be a number of seconds > 0, got {grace!r}.")
    candidate = Leader(name, using=using, ttl=ttl)  # refuses a backend that cannot lead
    backend = locks[using]
    ahead = float(grace) + KILL_MARGIN
    lease = backend.default_ttl if isinstance(ttl, _Default) else validate_ttl(ttl)
    window = notice(backend, lease)
    if ahead > window + 1e-9:  # (a float error is no excess: 0.3 + 0.5 > 2.4 / 3)
        raise ValueError(
            f"grace ({grace:g} s) + {KILL_MARGIN:g} s must fit in {window:g} s, a third of "
            "the term's lease (ZooKeeper: of its SESSION_TIMEOUT): the child must be dead "
            "before leadership can pass. Lower --grace or raise --ttl."
        )
    return _Runner(candidate, list(command), float(grace), ahead, say or _stderr).run()


def _stderr(line: str) -> None:
    print(f"distlock singleton: {line}", file=sys.stderr, flush=True)


class _Stopped(BaseException):
    """A signal asked the runner to stop while it was not leading (no child runs)."""


class _Runner:
    """One run of :func:`run_singleton`: the campaign, the child, the signals."""

    def __init__(
        self, candidate: Leader, command: list[str], grace: float, ahead: float,
        say: Callable[[str], object],
    ) -> None:
        self.candidate = candidate
        self.command = command
        self.grace = grace
        self.ahead = ahead
        self.say = say
        self.wake = threading.Event()  # the child ended, the term was lost, a signal came
        self.leading = False
        self.stopping: int | None = None  # the signal that asked to stop
        self.stop = threading.Event()  # ends the campaign
        self.status: int | None = None  # the child's, once the run ends

    def run(self) -> int:
        previous = {
            signum: signal.signal(signum, self._signalled)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            self.say(f"campaigning for {self.candidate.name!r} on {self.candidate.alias!r}")
            self.candidate.campaign(self._lead, stop=self.stop, poll=3600.0)
        except _Stopped:
            self.say(f"stopped by signal {self.stopping} while not leading")
            return 128 + (self.stopping or 0)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.status if self.status is not None else 128 + (self.stopping or 0)

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = signum
        if not self.leading:
            raise _Stopped  # waiting to lead: unwind the wait (nothing runs)
        self.stop.set()
        self.wake.set()

    def _lead(self, term: Term) -> None:
        self.wake.clear()
        self.leading = True
        try:
            if self.stopping is not None:
                self.stop.set()
                return
            child = self._start(term)
            threading.Thread(target=self._reap, args=(child,), daemon=True).start()
            term.on_lost(lambda _: self.wake.set())
            while True:
                if child.poll() is not None:  # ended by itself: the runner ends too
                    self.status = _status(child.returncode)
                    self.say(f"the command ended with status {self.status}")
                    self.stop.set()
                    return
                if self.stopping is not None:
                    self._stop_child(child, f"signal {self.stopping}")
                    self.status = _status(child.returncode)
                    return
                remaining = term.remaining
                if term.lost or (remaining is not None and remaining <= self.ahead):
                    why = "lost" if term.lost else f"not renewed, {remaining:.2f} s left"
                    self._stop_child(child, f"term {term.epoch} {why}")
                    self.say("campaigning again")
                    return
                self.wake.wait(None if remaining is None else remaining - self.ahead)
                self.wake.clear()
        finally:
            self.leading = False

    def _start(self, term: Term) -> subprocess.Popen[bytes]:
        env = {**os.environ, EPOCH_ENV: str(term.epoch), LEADER_ENV: term.name}
        # Started from this thread, which outlives the child: the parent-death signal
        # follows the thread that forked, not the process.
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_DEATHSIG), str(os.getpid()), *self.command],
            env=env, start_new_session=True,
        )
        self.say(f"leading {term.name!r}, epoch {term.epoch}: started {self.command[0]!r} "
                 f"(pid {child.pid})")
        return child

    def _reap(self, child: subprocess.Popen[bytes]) -> None:
        child.wait()
        self.wake.set()

    def _stop_child(self, child: subprocess.Popen[bytes], why: str) -> None:
        """SIGTERM to the child's process group, SIGKILL after ``grace``."""
        if child.poll() is not None:
            return
        self.say(f"{why}: stopping pid {child.pid} (SIGTERM, SIGKILL after {self.grace:g} s)")
        _signal_group(child, signal.SIGTERM)
        try:
            child.wait(self.grace)
        except subprocess.TimeoutExpired:
            self.say(f"pid {child.pid} did not end within {self.grace:g} s: SIGKILL")
            _signal_group(child, signal.SIGKILL)
            child.wait()
        self.say(f"pid {child.pid} ended with status {_status(child.returncode)}")


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # ended meanwhile
        os.killpg(child.pid, signum)


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
