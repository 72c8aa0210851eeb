"""Moved to :mod:`django_distlock.operations.release`; this path stays for imports that name it."""

from ..operations.release import NOT_FREED, release_audited

__all__ = ["NOT_FREED", "release_audited"]
