"""Tables of django-distlock."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


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
        indexes = [
            # Listing held leases walks only held rows (see DatabaseBackend.held_locks).
            models.Index(
                fields=["name"], condition=Q(owner__isnull=False), name="distlock_held_idx"
            ),
            # The listing by age (backends/database/ordered.py): held longest first,
            # expiring soonest first, each page one range of one of these.
            models.Index(
                fields=["acquired_at", "name"], condition=Q(owner__isnull=False),
                name="distlock_held_acquired_idx",
            ),
            models.Index(
                fields=["expires_at", "name"], condition=Q(owner__isnull=False),
                name="distlock_held_expires_idx",
            ),
        ]

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


class LockEvent(models.Model):
    """One line of the audit trail: a hold (written when it ends, with its wait and hold
    times), a failed acquisition, or an operator's action (a force release, a purge) with
    who and why.

    A hold is one row: kind ``released`` or ``lost``, ``acquired_at`` its start, ``at``
    its end. Kind ``acquired`` is a hold still open when its process exited (and, in
    rows written before 0.x's migration 0010, the start of every hold). Its Meta holds
    the permissions of the held-locks pages of the admin.
    """

    ACQUIRED = "acquired"
    RELEASED = "released"
    LOST = "lost"
    FAILED = "failed"
    FORCE_RELEASED = "force_released"
    PURGED = "purged"
    KINDS = [
        (ACQUIRED, "acquired (still held)"),
        (RELEASED, "held and released"),
        (LOST, "held, then expired or lost"),
        (FAILED, "failed to acquire"),
        (FORCE_RELEASED, "force-released"),
        (PURGED, "audit trail purged"),
    ]
    #: Kinds a routine purge keeps (only ``purge(operator_actions=True)`` deletes them).
    OPERATOR_KINDS = (FORCE_RELEASED, PURGED)

    #: When the event happened; of a hold, when it ended.
    at = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=20, choices=KINDS)
    #: Of a hold: when it was acquired (this process' clock; None in rows before 0010).
    acquired_at = models.DateTimeField(null=True, blank=True)
    alias = models.CharField(max_length=100)
    name = models.CharField(max_length=255)
    fencing_token = models.BigIntegerField(null=True, blank=True)
    #: The short, non-secret owner id of the holder (never the owner token).
    owner = models.CharField(max_length=16, blank=True, default="")
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    thread = models.CharField(max_length=255, blank=True, default="")
    #: What the holder was doing: the request path or task name (``context.py``).
    context = models.CharField(max_length=255, blank=True, default="")
    #: Seconds waited before the grant (holds, failed).
    waited = models.FloatField(null=True, blank=True)
    #: Seconds the lock was held (released, lost, force-released when known).
    held = models.FloatField(null=True, blank=True)
    #: Who forced a release or purged (a username, "command:<user>" for the management
    #: command, "task:purge_audit" for the Celery task).
    actor = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")

    class Meta:
        db_table = "django_distlock_event"
        verbose_name = "lock event"
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["alias", "name", "at"], name="distlock_event_name_idx")]
        permissions = [
            ("view_held_lock", "Can see the held locks"),
            ("force_release_lock", "Can force-release a held lock"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.alias}:{self.name}"


class LockActivity(models.Model):
    """Counts of the audit trail per time bucket, alias and name prefix: what the activity
    page reads, so that its cost does not grow with the trail (``audit/buckets.py``).

    The recorder's writer adds each batch it writes; ``waits`` and ``holds`` are
    histograms (bucket index -> count, ``audit/buckets.py``'s ``BOUNDS``).
    """

    #: The bucket's length in seconds (one of ``audit/buckets.py``'s ``SPANS``).
    span = models.IntegerField()
    start = models.DateTimeField()
    alias = models.CharField(max_length=100)
    #: The names' part up to their first ``:`` (``order:`` for ``order:42``).
    prefix = models.CharField(max_length=255)
    acquired = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    lost = models.BigIntegerField(default=0)
    forced = models.BigIntegerField(default=0)
    waits = models.JSONField(default=dict)
    holds = models.JSONField(default=dict)

    class Meta:
        db_table = "django_distlock_activity"
        verbose_name = "lock activity bucket"
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(
                fields=["span", "start", "alias", "prefix"], name="distlock_activity_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.alias} {self.prefix} {self.start} ({self.span} s)"


class HeldLock(LockEvent):
    """No table of its own: the admin's "Held locks" entry (admin home and app page),
    which opens the held-locks page. Its permissions are ``LockEvent``'s."""

    class Meta:
        proxy = True
        verbose_name = "held lock"
        default_permissions = ()
