"""Signals sent on lock events.

Each is sent with ``sender`` = the backend class and the keyword arguments
``backend``, ``alias``, ``name`` and ``fencing_token``; those sent by a lock
handle also carry ``handle`` (its ``host``, ``pid``, ``thread``, ``owner_id``
and ``held_for`` describe the holder). ``lock_acquired`` and
``lock_not_acquired`` carry ``waited`` (seconds spent in ``acquire()``);
``lock_force_released`` carries no token and no handle. Receivers run on the
hot path: keep them quick.
"""

from django.dispatch import Signal

lock_acquired = Signal()
#: ``acquire()`` returned False: timed out, or busy without blocking.
lock_not_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
lock_force_released = Signal()
