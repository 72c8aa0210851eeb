"""Models for the optimistic admin tests."""

from django.db import models

from django_distlock.contrib.optimistic import OptimisticLockMixin, VersionField

__all__ = ["Article", "ArticleNoActions", "Memo"]


class Article(OptimisticLockMixin, models.Model):
    """Edited through the change form, list_editable and actions."""

    STATUS_CHOICES = [("draft", "Draft"), ("live", "Live")]

    title = models.CharField(max_length=60)
    status = models.CharField(max_length=10, choices=STATUS_CHOICES, default="draft")
    price = models.IntegerField("unit price", default=0)
    body = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return self.title


class ArticleNoActions(Article):
    """The same rows, registered with an admin that has no actions (no checkbox column)."""

    class Meta:
        proxy = True


class Memo(OptimisticLockMixin, models.Model):
    """The version column renamed, and an admin with explicit fieldsets."""

    version = None  # type: ignore[assignment]
    revision = VersionField()
    text = models.CharField(max_length=60)
    secret = models.CharField(max_length=60, default="")

    def __str__(self) -> str:
        return self.text
