"""The admin's "Held locks" entry: no table of its own."""

from __future__ import annotations

from django_distlock.models import LockRecord


class HeldLock(LockRecord):
    """A proxy of the lock rows, never listed itself: the admin home's "Held locks"
    entry (admin home and app page), which opens the held-locks page of every alias.
    Its Meta holds the two permissions of those pages."""

    class Meta:
        proxy = True
        verbose_name = "held lock"
        default_permissions = ()
        permissions = [
            ("view_held_lock", "Can see the held locks"),
            ("force_release_lock", "Can force-release a held lock"),
        ]
