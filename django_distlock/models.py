"""Tables of django-distlock."""

from __future__ import annotations

from django.db import models


class LockRecord(models.Model):
    """One row per lock name ever used by the database backend.

    The row stays after release so its fencing counter keeps growing. In
    lease mode ``owner`` is set while held; in transaction mode the row
    lock of the holder's open transaction is the lock, and ``owner`` stays
    empty. Times come from the database's clock.
    """

    name = models.CharField(max_length=255, primary_key=True)
    owner = models.CharField(max_length=64, null=True, blank=True)
    fencing = models.BigIntegerField(default=0)
    acquired_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    thread = models.CharField(max_length=255, blank=True, default="")
    # PostgreSQL lease mode: the waiter a release hands the lock over to (see
    # docs/database.md); the row's holder columns take these values then.
    next_owner = models.CharField(max_length=64, null=True, blank=True)
    next_ttl = models.FloatField(null=True, blank=True)
    next_host = models.CharField(max_length=255, null=True, blank=True)
    next_pid = models.IntegerField(null=True, blank=True)
    next_thread = models.CharField(max_length=255, null=True, blank=True)
    # The server's epoch when the reservation was made (see docs/database.md).
    next_epoch = models.BigIntegerField(null=True, blank=True)
    # Lease mode, read-write locks and semaphores (docs/database.md): a semaphore's limit,
    # binding while its permits are held; a waiting writer's mark (it keeps new readers
    # out) and when it lapses if the writer stops renewing it.
    share_limit = models.IntegerField(null=True, blank=True)
    intent_owner = models.CharField(max_length=64, null=True, blank=True)
    intent_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "django_distlock_lock"
        verbose_name = "lock record"
        # Its three indexes of held rows (for the listings by name and by age) are made
        # by the migration, per vendor: partial indexes on PostgreSQL and SQLite, indexes
        # of generated columns on MySQL and MariaDB, which have no partial indexes (and
        # where Django would warn, models.W037, on every migrate of a conditional index).

    def __str__(self) -> str:
        return self.name


class LockShare(models.Model):
    """Lease mode: one reader of a read-write lock, or one permit of a semaphore.

    Each share has its own expiry, on the database's clock. While shares are held, the
    name's :class:`LockRecord` row shows ``owner`` ``"~read"`` or ``"~semaphore"`` and
    the latest end of its live shares, so an exclusive ``lock()`` of the name waits
    without reading this table (docs/database.md).
    """

    name = models.CharField(max_length=255)
    owner = models.CharField(max_length=64)
    #: ``"read"`` or ``"semaphore"``.
    kind = models.CharField(max_length=16)
    fencing = models.BigIntegerField()
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    thread = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        db_table = "django_distlock_share"
        verbose_name = "lock share"
        constraints = [
            models.UniqueConstraint(fields=["name", "owner"], name="distlock_share_owner_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"
