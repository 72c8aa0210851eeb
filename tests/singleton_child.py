"""The command the singleton runner's tests run: ``python tests/singleton_child.py PATH``.

Appends JSON lines to PATH: ``start`` (with its ``DISTLOCK_EPOCH``), a ``beat`` every
20 ms while it runs, ``end`` when SIGTERM stops it (then exits 0). A SIGKILL leaves its
last beat as its end: its interval ends within 20 ms of that. Times are
``time.monotonic_ns()`` (system-wide on Linux: they compare with other processes').
"""

import json
import os
import signal
import sys
import time

path = sys.argv[1]
epoch = int(os.environ["DISTLOCK_EPOCH"])
out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def emit(ev: str) -> None:
    line = json.dumps({"ev": ev, "pid": os.getpid(), "epoch": epoch, "t": time.monotonic_ns()})
    os.write(out, (line + "\n").encode())


def stop(signum: int, frame: object) -> None:
    emit("end")
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
emit("start")
while True:
    time.sleep(0.02)
    emit("beat")
