"""The live progress line of a flash sale: units sold per strategy, and time elapsed."""

from __future__ import annotations

import shutil
import time

from django.core.management.base import OutputWrapper


class Progress:
    """Rewrites one line (``\\r``) on a terminal; prints a line every ``interval`` s otherwise.

    :param enabled: False prints nothing (``--no-progress``).
    """

    def __init__(self, stdout: OutputWrapper, *, enabled: bool, interval: float = 0.5) -> None:
        self.stdout = stdout
        self.enabled = enabled
        self.tty = stdout.isatty()
        self.interval = 0.1 if self.tty else interval
        self._done: list[str] = []
        self._last = 0.0
        self._width = 0

    def update(self, name: str, sold: int, stock: int, elapsed: float, force: bool = False) -> None:
        """Show ``sold`` units of ``stock`` for the running strategy (rate-limited)."""
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.interval):
            return
        self._last = now
        parts = [*self._done, f"{name}: {sold}/{stock} sold"]
        self._show(f"flash sale  {' | '.join(parts)}  [{elapsed:.1f} s]")

    def finish(self, name: str, sold: int, stock: int, elapsed: float) -> None:
        """Show the final count of a strategy and keep it on the line for the next ones."""
        self.update(name, sold, stock, elapsed, force=True)
        self._done.append(f"{name}: {sold}")

    def skip(self, name: str) -> None:
        """Note a strategy that does not run."""
        self._done.append(f"{name}: skipped")

    def close(self) -> None:
        """End the progress line, before the table."""
        if self.enabled and self.tty and self._width:
            self.stdout.write("")
        self._width = 0

    def _show(self, line: str) -> None:
        if self.tty:
            # A line longer than the terminal would wrap, and \r would not rewrite it.
            line = line[: max(shutil.get_terminal_size().columns - 1, 20)]
            padding = " " * max(self._width - len(line), 0)
            self._width = len(line)
            self.stdout.write(f"\r{line}{padding}", ending="")
        else:
            self.stdout.write(line)
        self.stdout.flush()
