"""A private PostgreSQL, and a standby of it, for the tests that promote the standby in
its primary's place (the suite's server of ``scripts/test`` is never touched); the
suite's ``pg`` alias points at one of them while a test uses it."""

from __future__ import annotations

import contextlib
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from . import private_database
from .private_redis import _free_port
from .test_zookeeper_faults import _servers


class Postgres:
    """A PostgreSQL 15 on a free loopback port and a data dir of its own, started as
    ``scripts/servers.py`` starts the suite's (:meth:`start`), or as a streaming standby
    of another (:meth:`follow`), which :meth:`promote` makes a primary."""

    def __init__(self) -> None:
        self.servers = _servers()
        # The postgres user runs it: not under pytest's tmp_path (mode 0700 parents).
        self.directory = Path(tempfile.mkdtemp(prefix="distlock-pg-"))
        self.port = _free_port()
        self.entry: dict[str, Any] | None = None

    def start(self) -> None:
        self.entry = self.servers.start_postgres(self.directory, self.port)

    def follow(self, primary: Postgres) -> None:
        """Start as a standby of ``primary``: a base backup of it (``pg_basebackup -R``),
        then streaming replication from it."""
        servers, q = self.servers, shlex.quote
        wd = self.directory / "postgres"
        data, sock, log = wd / "data", wd / "run", wd / "postgres.log"
        for d in (wd, sock):
            d.mkdir()
            shutil.chown(d, "postgres", "postgres")
        self.directory.chmod(self.directory.stat().st_mode | 0o011)
        backup = (f"{q(str(servers.PG_BIN / 'pg_basebackup'))} -h 127.0.0.1 "
                  f"-p {primary.port} -U postgres -D {q(str(data))} -R -X stream -c fast")
        assert servers.su_postgres(backup, wd / "setup.log") == 0, (wd / "setup.log").read_text()
        with open(data / "postgresql.conf", "a") as conf:  # the primary's, copied: its own
            conf.write(f"\nport = {self.port}\nunix_socket_directories = '{sock}'\n")
        start = (f"{q(str(servers.PG_BIN / 'pg_ctl'))} -D {q(str(data))} -l {q(str(log))} "
                 "-w -t 30 start")
        assert servers.su_postgres(start, wd / "setup.log") == 0, log.read_text()
        pid = servers.postmaster_pid(data)
        self.entry = {"name": "postgres", "kind": "postgres", "port": self.port, "pid": pid,
                      "starttime": (servers.proc_stat(pid) or [None] * 20)[19],
                      "data": str(data), "log": str(log)}

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        """Run ``statement`` on database ``distlock`` in autocommit; its rows."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                             dbname="distlock", autocommit=True) as conn:
            cursor = conn.execute(statement)
            return list(cursor.fetchall()) if cursor.description else []

    def promote(self, primary: Postgres, seconds: float = 30) -> None:
        """Wait until this standby has replayed all of ``primary``'s log so far, then
        promote it: it takes the primary's place, as a failover does. All of it: the
        suite's servers commit without waiting for the log's flush
        (``synchronous_commit = off``), so the log written (and sent) may not yet hold
        the last commits; a standby that lags so gives their tokens again, as any
        asynchronous replica would."""
        ((written,),) = primary.sql("SELECT pg_current_wal_insert_lsn()::text")
        until = time.monotonic() + seconds
        while not self.sql(f"SELECT pg_last_wal_replay_lsn() >= '{written}'::pg_lsn")[0][0]:
            assert time.monotonic() < until, f"the standby did not replay up to {written}"
            time.sleep(0.05)
        assert self.entry is not None
        promote = (f"{shlex.quote(str(self.servers.PG_BIN / 'pg_ctl'))} -D "
                   f"{shlex.quote(self.entry['data'])} -w -t 30 promote")
        assert self.servers.su_postgres(promote) == 0

    def stop(self) -> None:
        if self.entry is not None:
            self.servers.stop_entries([self.entry])
        self.entry = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def borrowed(self, alias: str = "pg") -> contextlib.AbstractContextManager[str]:
        """The suite's Django alias ``alias`` pointed at this server while the block runs
        (:func:`private_database.borrowed`; a standby has the migration from its
        primary)."""
        return private_database.borrowed(alias, self.port, USER="postgres")

    def backend(self, alias: str, mode: str = "lease") -> Any:
        """A database backend in ``mode`` on the Django alias ``alias``."""
        return private_database.backend(alias, mode)
