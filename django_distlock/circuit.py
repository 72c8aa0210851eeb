"""Fail fast while a lock server is down: one circuit per alias (``FAIL_FAST``).

Without it, every request of a site whose ZooKeeper ensemble (or Redis, or
database) is down waits for the client's connect timeout before it fails, so sync
workers pile up behind a dead server. With ``DISTLOCK[alias]["FAIL_FAST"] = s``
(seconds, > 0), the first :class:`~django_distlock.exceptions.BackendUnavailable`
of an acquire or a listing *opens* the alias' circuit: from then on, acquires and
listings of that alias in this process raise ``BackendUnavailable`` at once, before
any server call, chained to the failure that opened it. A background thread probes
the server (:meth:`~django_distlock.backends.base.BaseLockBackend.health`) every
``s`` seconds and closes the circuit at the first answer; a call that reaches the
server and gets an answer closes it too.

What it never blocks: releases, extends and renewals of locks already held (a
release refused by a circuit opened by a passing failure would leave the lock held
until its lease ends), ``force_release`` and ``health``. The circuit is per
process: a forked child starts with it closed.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .exceptions import BackendUnavailable, InvalidBackendOptions

logger = logging.getLogger("django_distlock")

__all__ = ["Circuit", "validate_fail_fast"]

T = TypeVar("T")


def validate_fail_fast(alias: str, value: object) -> float:
    """Return the probe period of ``DISTLOCK[alias]["FAIL_FAST"]`` (0.0: no circuit).

    :param alias: the alias, for the message.
    :param value: the setting: seconds (a number from 0.01 to 3600), or 0/False/None
        for no circuit.
    :returns: the period in seconds, 0.0 when off.
    :raises InvalidBackendOptions: for anything else.
    """
    if value is None or value is False or value == 0:
        return 0.0
    if (
        isinstance(value, bool) or not isinstance(value, (int, float))
        or not math.isfinite(value) or not 0.01 <= value <= 3600
    ):
        raise InvalidBackendOptions(
            f"DISTLOCK[{alias!r}]['FAIL_FAST'] must be seconds from 0.01 to 3600 (how "
            f"long acquires fail at once after the server failed, between probes), or 0 "
            f"for none; got {value!r}."
        )
    return float(value)


class Circuit:
    """The circuit of one alias in this process (see the module)."""

    def __init__(self, alias: str, probe: Callable[[], object], period: float) -> None:
        #: The lock alias (named in messages and the probe thread's name).
        self.alias = alias
        #: One round trip to the server (the backend's ``health()``).
        self.probe = probe
        #: Seconds between probes while open; 0.0: the circuit never opens.
        self.period = period
        #: The failure that opened the circuit, while open (else None).
        self.cause: BaseException | None = None
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._probe: threading.Thread | None = None

    @property
    def open(self) -> bool:
        """Whether calls fail at once now (in this process)."""
        return self.cause is not None and self._pid == os.getpid()

    def check(self, doing: str, name: str = "") -> None:
        """Raise at once while the circuit is open.

        :param doing: what was refused, for the message ("acquire").
        :param name: the lock's name, if any, for the message.
        :raises BackendUnavailable: while open, chained to the failure that opened it.
        """
        cause = self.cause
        if cause is None:
            return
        if self._pid != os.getpid():  # a forked child: its parent's circuit is not its own
            self._reset()
            return
        what = f"{doing} {name!r}" if name else doing
        raise BackendUnavailable(
            f"Lock alias {self.alias!r} failed recently ({cause}); refused to "
            f"{what} at once, without a server call (FAIL_FAST: probing every "
            f"{self.period:g} s until the server answers)."
        ) from cause

    def call(self, doing: str, call: Callable[..., T], *args: Any, name: str = "") -> T:
        """Make one server call through the circuit: refused at once while open, its
        ``BackendUnavailable`` opening it, an answer closing it.

        :param doing: what the call does, for the refusal's message.
        :param call: the backend's call; ``args`` are its arguments.
        :param name: the lock's name, if any, for the message.
        :returns: what the call returns.
        :raises BackendUnavailable: while open, or when the call raises it.
        """
        if self.cause is not None:
            self.check(doing, name)
        try:
            result = call(*args)
        except BackendUnavailable as exc:
            self.failed(exc)
            raise
        self.answered()
        return result

    def failed(self, exc: BaseException) -> None:
        """Open the circuit after ``exc`` (a ``BackendUnavailable``), if it has one, and
        start the background probe.

        :param exc: the failure.
        """
        if not self.period:
            return
        with self._mutex:
            if self._pid != os.getpid():
                self._pid, self._probe = os.getpid(), None
            opening = self.cause is None
            self.cause = exc
            if self._probe is None:
                self._probe = threading.Thread(
                    target=self._probing, name=f"distlock-probe-{self.alias}",
                    daemon=True,
                )
                self._probe.start()
        if opening:
            logger.warning(
                "Lock alias %r failed: acquires fail at once until the server answers "
                "(probing every %g s)", self.alias, self.period, exc_info=exc,
            )

    def answered(self) -> None:
        """A call reached the server and got an answer: close the circuit."""
        if self.cause is not None:
            self._close()

    def _probing(self) -> None:
        while True:
            time.sleep(self.period)
            if self.cause is None:
                break
            try:
                self.probe()
            except BackendUnavailable as exc:
                self.cause = exc
                continue
            except Exception as exc:  # a backend's bug must not kill the probe silently
                logger.exception("Probing lock alias %r failed", self.alias)
                self.cause = exc
                continue
            self._close()
            break
        with self._mutex:
            if self._probe is threading.current_thread():
                self._probe = None
            if self.cause is not None and self._probe is None:  # opened again as we left
                self._probe = threading.Thread(target=self._probing, daemon=True,
                                               name=f"distlock-probe-{self.alias}")
                self._probe.start()

    def _close(self) -> None:
        with self._mutex:
            was_open, self.cause = self.cause is not None, None
        if was_open:
            logger.info("Lock alias %r answers again: its circuit is closed", self.alias)

    def _reset(self) -> None:
        with self._mutex:
            self._pid, self.cause, self._probe = os.getpid(), None, None
