"""Signals sent on lock events.

Each is sent with ``sender`` = the backend instance and the keyword
arguments ``alias``, ``name`` and ``fencing_token``; ``lock_acquired`` also
carries ``waited`` (seconds spent waiting), ``lock_force_released`` carries
no token. Receivers run on the hot path: keep them quick.
"""

from django.dispatch import Signal

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_force_released = Signal()
