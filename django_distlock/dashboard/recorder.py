"""Moved to :mod:`django_distlock.audit.recorder`; this path stays for imports that name it."""

from ..audit.recorder import (
    CAPACITY,
    EXIT_TIMEOUT,
    FLUSH_INTERVAL,
    Recorder,
    connect,
    disconnect,
    recorded_elsewhere,
    recorder,
)

__all__ = [
    "CAPACITY",
    "EXIT_TIMEOUT",
    "FLUSH_INTERVAL",
    "Recorder",
    "connect",
    "disconnect",
    "recorded_elsewhere",
    "recorder",
]
