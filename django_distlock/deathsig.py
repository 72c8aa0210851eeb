"""Run by the singleton runner (``singleton.py``) as a script, not imported:
``python -I -S deathsig.py RUNNER_PID COMMAND [ARGS...]``.

It asks Linux to SIGKILL this process when the thread that started it exits
(``prctl(PR_SET_PDEATHSIG)``, kept across ``execve``), checks that the runner did not
die before that (its parent would have changed: then it runs nothing), and replaces
itself with COMMAND. So the runner's child dies with the runner, even a SIGKILLed one,
and two runners' children never run at once. A script of the standard library only:
the package (and Django) is not imported between the fork and the command.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    runner, command = int(argv[1]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        print(f"distlock singleton: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(error)}",
              file=sys.stderr)
        return 126
    if os.getppid() != runner:  # the runner died before prctl: nobody stops this child
        return 125
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"distlock singleton: cannot run {command[0]!r}: {exc}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
