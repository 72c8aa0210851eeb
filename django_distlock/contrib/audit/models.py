"""The audit trail's tables: one row per hold or operator action, and their counts per
time bucket (table names kept from before the app had its own label)."""

from __future__ import annotations

from django.db import models


class LockEvent(models.Model):
    """One line of the audit trail: a hold (written when it ends, with its wait and hold
    times), a failed acquisition, or an operator's action (a force release, a purge) with
    who and why.

    A hold is one row: kind ``released`` or ``lost``, ``acquired_at`` its start, ``at``
    its end. Kind ``acquired`` is a hold still open when its process exited (and, in
    rows written by development versions before 0.1.0, the start of every hold).
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
    #: Why: the operator's words; of a failed acquisition that raised, the error.
    reason = models.TextField(blank=True, default="")

    class Meta:
        db_table = "django_distlock_event"
        verbose_name = "lock event"
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["alias", "name", "at"], name="distlock_event_name_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.alias}:{self.name}"


class LockActivity(models.Model):
    """Counts of the audit trail per time bucket, alias and name prefix: what the activity
    page reads, so that its cost does not grow with the trail (:mod:`.buckets`).

    The recorder's writer adds each batch it writes; ``waits`` and ``holds`` are
    histograms (bucket index -> count, :mod:`.buckets`'s ``BOUNDS``).
    """

    #: The bucket's length in seconds (one of :mod:`.buckets`'s ``SPANS``).
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
