"""Real Celery workers for tests: ``celery worker`` processes on a queue of their own.

::

    with CeleryWorkers("testproject", queue=f"tests-{os.getpid()}") as workers:
        app.conf.task_default_queue = workers.queue
        assert add.delay(1, 2).get(timeout=10) == 3

Each worker is a ``celery -A <app> worker`` process (prefork pool by default), in a
process group of its own so that stopping it also ends its pool's children. Waits
are bounded: a worker not ready in ``ready_timeout`` seconds fails the start with its
log's tail. Nothing here mocks Celery: the broker is whatever the app's settings name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["CeleryWorkers"]


class CeleryWorkers:
    """Start and stop ``celery worker`` processes.

    :param app: the ``-A`` argument (``"testproject"``).
    :param queue: the only queue they consume (default: one named after this process).
    :param workers: how many worker processes.
    :param concurrency: each one's pool size.
    :param pool: the pool (``"prefork"``, ``"threads"``, ``"solo"``).
    :param env: the workers' environment (default: this process').
    :param log_dir: where their log files go (default: a new temporary directory).
    :param ready_timeout: seconds to wait for every worker to be ready.
    :param extra_args: more ``celery worker`` arguments.
    """

    def __init__(
        self, app: str, *, queue: str | None = None, workers: int = 2, concurrency: int = 2,
        pool: str = "prefork", env: Mapping[str, str] | None = None,
        log_dir: str | os.PathLike[str] | None = None, ready_timeout: float = 60.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.queue = queue or f"distlock-{os.getpid()}-{time.monotonic_ns()}"
        self.count, self.concurrency, self.pool = workers, concurrency, pool
        self.env = dict(os.environ if env is None else env)
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="distlock-celery-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.ready_timeout = ready_timeout
        self.extra_args = list(extra_args)
        #: The worker processes (their main processes), once started.
        self.processes: list[subprocess.Popen[bytes]] = []

    def log(self, number: int) -> Path:
        """The log file of worker ``number`` (from 0).

        :param number: the worker's index.
        :returns: its path.
        """
        return self.log_dir / f"worker-{number}.log"

    def start(self) -> CeleryWorkers:
        """Start the workers and wait until each logs that it is ready.

        :returns: self.
        :raises RuntimeError: when one exits or is not ready in time (all are stopped).
        """
        for number in range(self.count):
            command = [
                sys.executable, "-m", "celery", "-A", self.app, "worker",
                "--pool", self.pool, "--concurrency", str(self.concurrency),
                "--queues", self.queue, "--hostname", f"{self.queue}-{number}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--prefetch-multiplier", "1", "--loglevel", "INFO",
                "--logfile", str(self.log(number)), *self.extra_args,
            ]
            with open(self.log_dir / f"worker-{number}.out", "wb") as output:
                self.processes.append(subprocess.Popen(
                    command, env=self.env, stdout=output, stderr=subprocess.STDOUT,
                    start_new_session=True,
                ))
        deadline = time.monotonic() + self.ready_timeout
        waiting = set(range(self.count))
        while waiting:
            for number in list(waiting):
                if self.processes[number].poll() is not None:
                    self._fail(number, "exited")
                if self._ready(number):
                    waiting.discard(number)
            if waiting and time.monotonic() > deadline:
                self._fail(min(waiting), f"was not ready within {self.ready_timeout} s")
            time.sleep(0.05)
        return self

    def _ready(self, number: int) -> bool:
        path = self.log(number)
        return path.exists() and " ready." in path.read_text(errors="replace")

    def _fail(self, number: int, what: str) -> None:
        tail = ""  # the log, then what went to stdout/stderr (import errors)
        for path in (self.log(number), self.log_dir / f"worker-{number}.out"):
            if path.exists():
                tail += path.read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"Celery worker {number} {what}; its log ends:\n{tail}")

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every worker to stop (SIGTERM: a warm shutdown), then kill what is left
        after ``timeout`` seconds, pool children included.

        :param timeout: seconds to wait for the warm shutdown.
        """
        for proc in self.processes:
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.01))
            _signal_group(proc.pid, signal.SIGKILL)  # leftover children too
            proc.wait(10)
        self.processes = []

    def pids(self) -> list[int]:
        """The workers' main process ids.

        :returns: the pids, in start order.
        """
        return [proc.pid for proc in self.processes]

    def __enter__(self) -> CeleryWorkers:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)

