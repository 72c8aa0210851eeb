"""The database backend: a lock row per key, on PostgreSQL, SQLite, or MySQL and MariaDB.

``BACKEND: "django_distlock.backends.database.DatabaseBackend"``; ``OPTIONS["MODE"]``
picks lease mode (``lease.py``, the default), transaction mode (``transaction.py``)
or session mode (``session_mode.py``: PostgreSQL; ``session_mysql.py``: MySQL and
MariaDB). See docs/database.md.
"""

from .backend import DatabaseBackend
from .lease import LeaseBackend, SqliteLeaseBackend
from .session_mode import SessionModeBackend
from .session_mysql import MySqlSessionBackend
from .transaction import SqliteTransactionBackend, TransactionBackend

__all__ = [
    "DatabaseBackend",
    "LeaseBackend",
    "MySqlSessionBackend",
    "SessionModeBackend",
    "SqliteLeaseBackend",
    "SqliteTransactionBackend",
    "TransactionBackend",
]
