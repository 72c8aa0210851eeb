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

#: ``acquire()`` returned True: the lock is held (``waited``: seconds spent in it).
lock_acquired = Signal()
#: ``acquire()`` returned False: timed out, or busy without blocking.
lock_not_acquired = Signal()
#: A held lock was released by its handle.
lock_released = Signal()
#: A handle learned its lock is gone (a release found it taken, a session ended, a renewal
#: was refused; ``mark_lost()``); sent once per grant.
lock_lost = Signal()
#: ``force_release()`` freed a lock held by someone (no token, no handle).
lock_force_released = Signal()
