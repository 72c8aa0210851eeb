"""The kinds x backends matrix of ``docs/kinds.md``, generated from the backends' flags.

``python -m django_distlock.testing.matrix`` prints it as Markdown; a test fails when
``docs/kinds.md`` differs, so the table stays what the ``supports_*`` flags say (and
the contract suite checks every flag against behaviour). A "no" cell's reason is the
backend's own ``why_unsupported`` entry, else :data:`REASONS`; a "no" without one is
an error; a reason left for a cell that became "yes" is listed by
:func:`stale_reasons` (the test asks to drop it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["COLUMNS", "REASONS", "ROWS", "Column", "cells", "markdown", "stale_reasons"]


@dataclass(frozen=True)
class Column:
    """One backend as configured: its label, class path, and the database vendor whose
    class serves it (database backend only)."""

    label: str
    path: str
    vendor: str = ""
    mode: str = ""

    def backend_class(self) -> type | None:
        """The class that serves this column, None when its module is not installed."""
        module, _, name = self.path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return None
        if self.mode:
            cls = cls.modes[self.mode].for_vendor(self.vendor)
        return cls


_DB = "django_distlock.backends.database.DatabaseBackend"
_REDIS = "django_distlock.backends.redis.RedisBackend"
COLUMNS = (
    Column("PostgreSQL lease", _DB, "postgresql", "lease"),
    Column("SQLite lease", _DB, "sqlite", "lease"),
    Column("MySQL/MariaDB lease", _DB, "mysql", "lease"),
    Column("PostgreSQL transaction", _DB, "postgresql", "transaction"),
    Column("PostgreSQL session", _DB, "postgresql", "session"),
    Column("MySQL/MariaDB session", _DB, "mysql", "session"),
    Column("SQLite transaction", _DB, "sqlite", "transaction"),
    Column("MySQL/MariaDB transaction", _DB, "mysql", "transaction"),
    Column("Redis", _REDIS),
    Column("Redis Cluster", _REDIS),
    Column("Redlock", "django_distlock.backends.redis.RedlockBackend"),
    Column("ZooKeeper", "django_distlock.backends.zookeeper.ZooKeeperBackend"),
    Column("cache (`add`)", "django_distlock.backends.cache.CacheBackend"),
    Column("locmem", "django_distlock.backends.locmem.LocMemBackend"),
)


def _flag(name: str) -> Callable[[type], bool]:
    return lambda cls: bool(getattr(cls, name))


def _always(cls: type) -> bool:
    return True


#: Where a backend class has no flag for a row, whether it offers it, by column label.
#: Fair: waiters served in arrival order by the server; else they poll with backoff.
_FAIR = {
    "PostgreSQL lease": True, "PostgreSQL transaction": True, "MySQL/MariaDB lease": True,
    "PostgreSQL session": True, "MySQL/MariaDB session": True,
    "Redis": True,
    "Redis Cluster": True, "ZooKeeper": True,
}

#: (row label, flag or None, how a class answers it).
ROWS: tuple[tuple[str, str | None, Callable[[type], bool] | None], ...] = (
    ("exclusive", None, _always),
    ("reentrant", None, _always),
    ("shared owner", "supports_shared_owner", _flag("supports_shared_owner")),
    ("read-write", "supports_read_write", _flag("supports_read_write")),
    ("semaphore", "supports_semaphore", _flag("supports_semaphore")),
    ("downgrade", "supports_downgrade", _flag("supports_downgrade")),
    ("multi-lock", None, _always),
    ("fair", None, None),
    ("fencing", "supports_fencing", _flag("supports_fencing")),
    ("expiry/renewal", "supports_expiry", _flag("supports_expiry")),
    ("leadership", "supports_leadership", _flag("supports_leadership")),
    ("listing", "supports_listing", _flag("supports_listing")),
    ("counting", "supports_counting", _flag("supports_counting")),
    ("force release", "supports_force_release", _flag("supports_force_release")),
    ("force release by owner", "supports_force_release_by_owner",
     _flag("supports_force_release_by_owner")),
    ("who waits", "supports_waiters", _flag("supports_waiters")),
    ("across processes", "distributed", _flag("distributed")),
    ("async", None, _always),
)

_TX = "a transaction-mode lock is a server-side row lock held by one connection"
_NO_DOWNGRADE = ("not built: the write lock's release would have to leave the name to "
                 "its holder's read share; that `read_lock` raises `SelfDeadlock` at once")
_LOCAL = "one process' memory: it excludes threads and tasks of that process only"
_NO_SHARED_OWNER = ("the server keeps no count of an owner's holds: only the reentrant "
                    "handles of one thread or task share a hold")
#: Why a "no" cell is no, by (column label, row label), where the backend's own
#: ``why_unsupported`` does not say.
REASONS: dict[tuple[str, str], str] = {
    **{
        (column, "shared owner"): _NO_SHARED_OWNER
        for column in ("PostgreSQL lease", "SQLite lease", "MySQL/MariaDB lease",
                       "PostgreSQL transaction",
                       "SQLite transaction", "MySQL/MariaDB transaction", "Redlock",
                       "cache (`add`)", "locmem")
    },
    ("SQLite lease", "fair"): "SQLite has no lock queue: waiters poll with backoff",
    ("PostgreSQL transaction", "read-write"): "`FOR SHARE` readers would let a stream of "
    "readers starve a writer and show no owner (docs/database.md)",
    ("PostgreSQL transaction", "semaphore"): _TX,
    ("PostgreSQL transaction", "expiry/renewal"): "held until the transaction ends",
    ("PostgreSQL session", "read-write"): "not built yet (PostgreSQL's shared advisory "
    "locks can serve it: docs/database.md)",
    ("PostgreSQL session", "semaphore"): "an advisory lock has one holder; not built",
    ("MySQL/MariaDB session", "read-write"): "a named lock (`GET_LOCK`) has no shared mode",
    ("MySQL/MariaDB session", "semaphore"): "a named lock has one holder; not built",
    ("MySQL/MariaDB transaction", "read-write"): "`LOCK IN SHARE MODE` readers would let a "
    "stream of readers starve a writer and show no owner, as on PostgreSQL",
    ("MySQL/MariaDB transaction", "semaphore"): _TX,
    ("MySQL/MariaDB transaction", "expiry/renewal"): "held until the transaction ends",
    ("MySQL/MariaDB transaction", "fair"): "InnoDB's lock queue: MariaDB served 8 processes "
    "evenly (docs/benchmarks.md), but MySQL 8.0.20+ grants by the waiting transactions' "
    "weight, not in arrival order (not run here)",
    ("SQLite transaction", "read-write"): "the lock is the database's single write lock",
    ("SQLite transaction", "semaphore"): "the lock is the database's single write lock",
    ("SQLite transaction", "fair"): "SQLite's busy handler retries: no queue",
    ("SQLite transaction", "expiry/renewal"): "held until the transaction ends",
    ("PostgreSQL lease", "downgrade"): _NO_DOWNGRADE,
    ("SQLite lease", "downgrade"): _NO_DOWNGRADE,
    ("MySQL/MariaDB lease", "downgrade"): _NO_DOWNGRADE,
    ("Redis", "downgrade"): _NO_DOWNGRADE,
    ("Redis Cluster", "downgrade"): _NO_DOWNGRADE,
    ("Redlock", "counting"): "no master knows which locks a majority holds",
    ("cache (`add`)", "counting"): "a cache cannot count its keys at a cost bounded by a "
    "cap (memcached cannot list keys at all)",
    ("Redlock", "fair"): "independent masters cannot share one queue: waiters retry",
    ("cache (`add`)", "read-write"): "`add` takes one key; readers would need a counter "
    "that eviction can lose",
    ("cache (`add`)", "semaphore"): "a counter in a cache can be evicted apart from its "
    "holders",
    ("cache (`add`)", "fair"): "a cache has no queue: waiters poll with backoff and jitter",
    ("locmem", "read-write"): "not built (one process)",
    ("locmem", "semaphore"): "not built (one process: use `threading.BoundedSemaphore`)",
    ("locmem", "fair"): "a release wakes every waiter at once: the first to run wins",
    ("locmem", "across processes"): _LOCAL,
}


def cells() -> list[list[str]]:
    """The table's rows: a label, then one cell per installed backend column.

    :returns: the rows, "yes" or "no: <reason>" in each cell.
    :raises LookupError: for a "no" with no reason.
    """
    columns = [(column, cls) for column in COLUMNS if (cls := column.backend_class())]
    table = [["", *(column.label for column, _ in columns)]]
    for label, flag, offered in ROWS:
        row = [label]
        for column, cls in columns:
            yes = _FAIR.get(column.label, False) if offered is None else offered(cls)
            reason = REASONS.get((column.label, label))
            if yes:
                row.append("yes")
                continue
            own = getattr(cls, "why_unsupported", {}).get(flag or "")
            reason = own or reason
            if label == "downgrade" and not getattr(cls, "supports_read_write", False):
                reason = reason or "no read-write locks"
            if reason is None:
                raise LookupError(f"{column.label} / {label} is no, with no reason given.")
            row.append(f"no: {reason}")
        table.append(row)
    return table


def stale_reasons() -> list[tuple[str, str]]:
    """The cells of :data:`REASONS` to drop: their backend now offers the kind, or says
    why not itself (``why_unsupported``).

    :returns: (column label, row label) pairs.
    """
    table = cells()
    labels, rows = table[0], {row[0]: row for row in table[1:]}
    classes = {column.label: column.backend_class() for column in COLUMNS}
    flags = {label: flag for label, flag, _ in ROWS}
    return [
        (column, row) for column, row in REASONS
        if column in labels and (
            rows[row][labels.index(column)] == "yes"
            or flags[row] in getattr(classes[column], "why_unsupported", {})
        )
    ]


def markdown() -> str:
    """The matrix as Markdown (what ``docs/kinds.md`` holds between its markers): a table
    of "yes" and "no (n)", then the numbered reasons.

    :returns: the table and its notes, ending with a newline.
    """
    table = cells()
    notes: dict[str, int] = {}
    for row in table[1:]:
        for i, cell in enumerate(row[1:], 1):
            if cell.startswith("no: "):
                number = notes.setdefault(cell[4:], len(notes) + 1)
                row[i] = f"no ({number})"
    lines = ["| " + " | ".join(table[0]) + " |", "|" + " --- |" * len(table[0])]
    lines += ["| " + " | ".join(row) + " |" for row in table[1:]]
    lines.append("")
    lines += [f"{number}. {reason.rstrip('.')}." for reason, number in notes.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(INSTALLED_APPS=["django_distlock"], USE_TZ=True)
    django.setup()
    print(markdown(), end="")
