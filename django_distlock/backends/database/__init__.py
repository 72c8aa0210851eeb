"""The database backend: a lock row per key, on PostgreSQL, SQLite, or MySQL and MariaDB.

``BACKEND: "django_distlock.backends.database.DatabaseBackend"``; ``OPTIONS["MODE"]``
picks lease mode (``lease.py``, the default) or transaction mode
(``transaction.py``). See docs/database.md.
"""

from .backend import DatabaseBackend
from .lease import LeaseBackend, SqliteLeaseBackend
from .transaction import SqliteTransactionBackend, TransactionBackend

__all__ = [
    "DatabaseBackend",
    "LeaseBackend",
    "SqliteLeaseBackend",
    "SqliteTransactionBackend",
    "TransactionBackend",
]
