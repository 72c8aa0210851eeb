"""A private MariaDB for the tests that SIGKILL it and start it again on its data dir (the
shared server of ``scripts/test`` is never killed); the suite's ``mysql`` alias points at
it while a test uses it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.db import connections

from . import private_database
from .private_redis import _free_port
from .test_zookeeper_faults import _servers


class MariaDB:
    """``mariadbd`` on a free loopback port and a data dir of its own (as
    ``scripts/servers.py`` starts the suite's, durable: a commit is flushed to the log);
    :meth:`restart` SIGKILLs it and starts it on the same data dir."""

    def __init__(self) -> None:
        self.servers = _servers()
        # mariadbd runs as user mysql: not under pytest's tmp_path (mode 0700 parents).
        self.directory = Path(tempfile.mkdtemp(prefix="distlock-mariadb-"))
        self.port = _free_port()
        self.entry: dict[str, Any] | None = None

    def start(self) -> None:
        old = os.environ.get("DISTLOCK_MYSQL_DURABLE")
        os.environ["DISTLOCK_MYSQL_DURABLE"] = "1"
        try:
            self.entry = self.servers.start_mariadb(self.directory, self.port)
        finally:
            if old is None:
                del os.environ["DISTLOCK_MYSQL_DURABLE"]
            else:
                os.environ["DISTLOCK_MYSQL_DURABLE"] = old

    def restart(self, argv: list[str] | None = None, signum: int = signal.SIGKILL) -> None:
        """SIGKILL the server (no shutdown: InnoDB recovers from its log), or send it
        ``signum`` (SIGTERM: a clean shutdown, as a change of its binary log needs), and
        start it again once it is gone (with ``argv``, if given)."""
        assert self.entry is not None
        pid = self.entry["pid"]
        os.kill(pid, signum)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        self.servers.wait_until("mariadb", lambda: not self.servers.alive(pid), None, 60.0,
                                Path(self.entry["log"]))
        argv, data = argv or self.entry["argv"], self.entry["data"]
        wd = self.directory / "mariadb"
        log = Path(self.entry["log"])
        self.entry = self.servers.spawn("mariadb", "mariadb", self.port, argv, wd, log)
        self.entry.update(data=data, argv=argv)
        self.servers.wait_until("mariadb", lambda: self._greets(), self.entry, 30.0, log)

    @contextlib.contextmanager
    def binary_log(self, *options: str) -> Iterator[Path]:
        """The server restarted with a binary log (``options``: its format and the rest)
        while the block runs, then without; yields the log files' base name. Both
        restarts shut it down cleanly: after a crash with the log on, the server will
        not start without it."""
        assert self.entry is not None
        plain = list(self.entry["argv"])
        base = self.directory / "mariadb" / "binlog"
        self.restart([arg for arg in plain if arg != "--skip-log-bin"]
                     + [f"--log-bin={base}", "--server-id=1", *options], signal.SIGTERM)
        try:
            yield base
        finally:
            self.restart(plain, signal.SIGTERM)

    def sql(self, *statements: str) -> list[tuple[Any, ...]]:
        """Run ``statements`` in turn as the suite's user (every privilege) on a connection
        of their own; the last one's rows."""
        import MySQLdb

        conn = MySQLdb.connect(host="127.0.0.1", port=self.port, user="distlock",
                               autocommit=True)
        try:
            cursor = conn.cursor()
            for statement in statements:
                cursor.execute(statement)
            return list(cursor.fetchall())
        finally:
            conn.close()

    def follow(self, primary: MariaDB) -> None:
        """Make this server a replica of ``primary`` (started with :meth:`binary_log`),
        from the end of its log: both must hold the same tables by then (each migrated)."""
        ((log, position, *_),) = primary.sql("SHOW MASTER STATUS")
        self.sql(f"CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {primary.port}, "
                 f"MASTER_USER = 'distlock', MASTER_LOG_FILE = '{log}', "
                 f"MASTER_LOG_POS = {position}, MASTER_USE_GTID = no")
        self.sql("START SLAVE")

    def replication(self) -> dict[str, Any]:
        """This replica's ``SHOW SLAVE STATUS``, by column (its running threads and last
        errors first, for an assertion's message)."""
        import MySQLdb.cursors

        conn = MySQLdb.connect(host="127.0.0.1", port=self.port, user="distlock",
                               cursorclass=MySQLdb.cursors.DictCursor)
        try:
            cursor = conn.cursor()
            cursor.execute("SHOW SLAVE STATUS")
            found = dict(cursor.fetchone() or {})
            first = ("Slave_IO_Running", "Slave_SQL_Running", "Last_IO_Error",
                     "Last_SQL_Errno", "Last_SQL_Error")
            return {**{key: found.get(key) for key in first}, **found}
        finally:
            conn.close()

    def caught_up(self, primary: MariaDB, seconds: float = 30) -> bool:
        """Whether this replica applies all of ``primary``'s log written so far within
        ``seconds`` (False: it stopped, or is that far behind)."""
        ((log, position, *_),) = primary.sql("SHOW MASTER STATUS")
        ((applied,),) = self.sql(f"SELECT MASTER_POS_WAIT('{log}', {position}, {seconds})")
        return applied is not None and applied >= 0

    def promote(self, primary: MariaDB) -> None:
        """Wait until this replica has applied all of ``primary``'s log written so far,
        then stop replicating: this server takes the primary's place, as a failover
        does."""
        assert self.caught_up(primary), self.replication()
        self.sql("STOP SLAVE")
        self.sql("RESET SLAVE ALL")

    def _greets(self) -> bool:
        import socket

        with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
            head = s.recv(5)
        return len(head) == 5 and head[4] == 10

    def stop(self) -> None:
        if self.entry is not None:
            self.servers.stop_entries([self.entry])
        self.entry = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def borrowed(self, alias: str = "mysql", user: str = "distlock",
                 **options: Any) -> contextlib.AbstractContextManager[str]:
        """The suite's Django alias ``alias`` pointed at this server while the block runs,
        as ``user`` (``options`` added to its ``OPTIONS``): :func:`private_database.
        borrowed`."""
        saved = connections.settings[alias]
        return private_database.borrowed(
            alias, self.port, USER=user, OPTIONS={**saved.get("OPTIONS", {}), **options})

    def backend(self, alias: str, mode: str = "lease") -> Any:
        """A database backend in ``mode`` on the Django alias ``alias`` (of
        :meth:`borrowed`)."""
        return private_database.backend(alias, mode)
