"""The database backend on MariaDB (Debian 12's 10.11, through mysqlclient), transaction
mode: the shipped contract, and what InnoDB decides differently from PostgreSQL (whole
seconds of lock wait, no RETURNING, case-insensitive collations, GET_LOCK names).
Single tier: decided by the server and our SQL (CONTRIBUTING.md, "The tiers")."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction

from django_distlock import holder_context, locks
from django_distlock.backends.database.errors import mysql_errno
from django_distlock.backends.database.mysql_sql import MYSQL
from django_distlock.backends.database.ordered import age_statement
from django_distlock.backends.database.sql import upper_bound
from django_distlock.contrib.admin.operations.listing import backend_label
from django_distlock.exceptions import (
    BackendUnavailable,
    DistLockError,
    LockLost,
)
from django_distlock.testing import LockContract

from . import test_flashsale, test_prune
from .conftest import (
    DATABASES,
    LIBRARY_DB,
    eventually,
    in_thread,
    kill_mysql_connection,
    mysql_side,
    require_mysql,
)
from .figures import record
from .histories import FORK, done, fork_ready
from .private_mariadb import MariaDB
from .test_hostile import _acquire_retrying, _every_session_ended
from .test_hostile_kinds_servers import _restart_while_held

pytestmark = [pytest.mark.second_env, LIBRARY_DB]


@pytest.fixture(autouse=True)
def _mysql() -> None:
    require_mysql()


class TestMySqlLease(LockContract):
    alias = "mysql-lease"


class TestMySqlTransaction(LockContract):
    alias = "mysql-tx"


@pytest.mark.parametrize("alias", ["mysql-lease", "mysql-tx"])
def test_names_differing_in_case_accents_or_trailing_spaces_are_different_locks(
    alias: str, unique
) -> None:
    """The test database's collation is utf8mb4_general_ci, which would make these one
    row; the name column's binary NO PAD collation keeps them apart (and lease mode's
    named locks are called by a hash of the name: GET_LOCK ignores case)."""
    backend = locks[alias]
    names = [unique("Stock"), unique("stock"), unique("stock") + " ", unique("stöck"),
             unique("stock") + "\N{GRINNING FACE}", unique("long") + "x" * 200]
    with transaction.atomic(using="mysql"):
        handles = [backend.lock(name) for name in names]
        for handle in handles:
            assert handle.acquire(blocking=False), handle
        listed = {info.name for info in backend.held_locks()}
        locked = [backend.is_locked(name) for name in names]
        for handle in reversed(handles):
            handle.release()
    assert locked == [True] * len(names)
    assert listed >= set(names[:-1])  # the long one is listed by its digest
    assert len(listed) == len(names), listed


@contextlib.contextmanager
def held_by_another_thread(name: str) -> Iterator[None]:
    """``name`` held in transaction mode by another thread (its own connection and
    transaction) for the block."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with locks["mysql-tx"].lock(name):
            taken.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(10)
        yield
    finally:
        done.set()
        thread.join(10)


def test_a_fractional_timeout_is_honoured_and_not_left_on_the_session(unique) -> None:
    """InnoDB bounds a lock wait in whole seconds; the acquire bounds its own statement
    (max_statement_time), so 0.5 s waits about 0.5 s, and a query the holder of another
    lock runs later in the same transaction is not cut by it."""
    name = unique()

    def waiter() -> tuple[bool, float, float]:
        with transaction.atomic(using="mysql"):
            other = locks["mysql-tx"].lock(unique("other"))
            assert other.acquire(timeout=1)
            started = time.monotonic()
            got = locks["mysql-tx"].lock(name).acquire(timeout=0.5)
            waited = time.monotonic() - started
            started = time.monotonic()
            with connections["mysql"].cursor() as cursor:
                cursor.execute("DO SLEEP(1.2)")  # longer than the bound above
            slept = time.monotonic() - started
            other.release()
        return got, waited, slept

    with held_by_another_thread(name):
        got, waited, slept = in_thread(waiter)
    assert not got
    assert 0.4 <= waited < 0.9, waited
    assert slept >= 1.15, slept


@pytest.mark.parametrize("level", ["REPEATABLE READ", "READ COMMITTED"])
def test_a_new_name_inside_an_outer_block_is_granted(level: str, unique) -> None:
    """Under REPEATABLE READ a locking read of a row that does not exist takes a gap lock,
    kept by the caller's outer transaction: were the row made after that read, its insert
    would wait for the caller and the acquire would miss at its timeout (it did, 2 s)."""

    def run() -> bool:
        with connections["mysql"].cursor() as cursor:
            cursor.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {level}")
        try:
            with transaction.atomic(using="mysql"):
                with connections["mysql"].cursor() as cursor:
                    cursor.execute("SELECT COUNT(*) FROM django_distlock_lock")  # a snapshot
                handle = locks["mysql-tx"].lock(unique())
                got = handle.acquire(timeout=2)
                if got:
                    handle.release()
            return got
        finally:
            connections["mysql"].close()

    assert in_thread(run)


def test_a_non_blocking_miss_answers_without_waiting(unique) -> None:
    name = unique()

    def miss() -> tuple[bool, float]:
        started = time.monotonic()
        with transaction.atomic(using="mysql"):
            got = locks["mysql-tx"].lock(name).acquire(blocking=False)
        return got, time.monotonic() - started

    with held_by_another_thread(name):
        got, took = in_thread(miss)
    assert not got
    assert took < 0.5, took  # NOWAIT: no lock wait (whatever innodb_lock_wait_timeout is)


def test_a_rolled_back_grant_never_gives_its_token_again(unique) -> None:
    """Tokens come from an AUTO_INCREMENT counter, which a rollback does not turn back:
    the grant after a rolled-back one gets a higher token, never the same."""
    backend, name = locks["mysql-tx"], unique()
    tokens = []
    for commit in (False, True, False, True):
        try:
            with transaction.atomic(using="mysql"), backend.lock(name) as handle:
                tokens.append(handle.fencing_token)
                if not commit:
                    raise RuntimeError("roll back")
        except RuntimeError:
            pass
    assert tokens == sorted(set(tokens)), tokens


def test_a_holder_whose_connection_was_killed_hears_lock_lost(unique) -> None:
    """KILL CONNECTION of the holding session: InnoDB rolls its transaction back and
    frees the row; the holder's release is LockLost (its work did not commit), never a
    raw driver error, and the name is free for the next."""
    backend, name = locks["mysql-tx"], unique()

    def hold_and_lose() -> type[BaseException] | None:
        handle = backend.lock(name)
        assert handle.acquire(timeout=5)
        with connections["mysql"].cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID()")
            (ident,) = cursor.fetchone()
        kill_mysql_connection("mysql", ident)
        try:
            handle.release()
        except (LockLost, BackendUnavailable) as exc:
            return type(exc)
        finally:
            connections["mysql"].close()
        return None

    assert in_thread(hold_and_lose) is LockLost
    assert in_thread(lambda: backend.lock(name).acquire(timeout=2))


def test_the_listing_shows_transaction_mode_holders(unique) -> None:
    backend, name = locks["mysql-tx"], unique()
    with transaction.atomic(using="mysql"), backend.lock(name):
        seen = in_thread(lambda: [info.name for info in backend.held_locks(prefix=name)])
        locked = in_thread(lambda: backend.is_locked(name))
    assert seen == [name]
    assert locked
    assert not in_thread(lambda: backend.is_locked(name))
    assert in_thread(lambda: [info.name for info in backend.held_locks(prefix=name)]) == []


# -- lease mode ---------------------------------------------------------------------------


def _wait_then_hold(name: str, index: int, granted: object) -> None:
    handle = locks["mysql-lease"].lock(name, ttl=30, timeout=30)
    if handle.acquire():
        granted.put(index)  # type: ignore[attr-defined]
        time.sleep(0.05)
        handle.release()
    done()


def test_lease_waiters_are_granted_in_arrival_order(unique) -> None:
    """Processes queued one after another (each listed before the next comes) are granted
    in that order: the queue is the server's GET_LOCK queue, first come first served."""
    backend, name = locks["mysql-lease"], unique("fifo")
    holder = backend.lock(name, ttl=30)
    assert holder.acquire()
    fork_ready()
    granted = FORK.Queue()
    procs = []
    for index in range(5):
        proc = FORK.Process(target=_wait_then_hold, args=(name, index, granted))
        proc.start()
        procs.append(proc)
        assert eventually(lambda n=index + 1: len(backend.waiters(name)) == n, timeout=20)
    assert [w.pid for w in backend.waiters(name)] == [p.pid for p in procs]
    holder.release()
    order = [granted.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(10)
    assert order == list(range(5))
    assert backend.waiters(name) == []


def _wait_long(name: str) -> None:
    locks["mysql-lease"].lock(name, ttl=30).acquire(timeout=60)


def test_a_sigkilled_head_is_not_handed_the_lock(unique) -> None:
    """The head of the queue dies while it waits in the server: MariaDB goes on running
    its procedure (a named-lock wait of a client that is gone returns 0 early, not an
    error), which must leave rather than take the name for a process that is gone."""
    backend = locks["mysql-lease"]
    fork_ready()
    # Taken after fork_ready(), which closes this thread's session: the holder's session
    # lives on, holding the grant's generation lock that the head waits for.
    holder = backend.lock(unique("dead-head"), ttl=30)
    assert holder.acquire()
    head = FORK.Process(target=_wait_long, args=(holder.name,))
    head.start()
    assert eventually(lambda: [w.pid for w in backend.waiters(holder.name)] == [head.pid],
                      timeout=20)
    time.sleep(0.3)  # in its wait for the holder's generation lock
    os.kill(head.pid, signal.SIGKILL)
    head.join(10)
    time.sleep(2.5)  # the server sees the client gone within a second or two
    holder.release()
    newcomer = backend.lock(holder.name, ttl=30)
    assert newcomer.acquire(blocking=False)
    assert newcomer.fencing_token > holder.fencing_token
    newcomer.release()


def test_lease_tokens_grow_past_a_deleted_row(unique) -> None:
    """Fencing tokens come from one counter (sql/mysql.sql): a name whose row was deleted
    (as a prune does) and made anew goes on above every token it had."""
    backend, name = locks["mysql-lease"], unique("deleted")
    tokens = []
    for _ in range(3):
        with backend.lock(name, ttl=30) as handle:
            tokens.append(handle.fencing_token)
    with connections["mysql"].cursor() as cursor:
        cursor.execute("DELETE FROM django_distlock_lock WHERE name = %s",
                       [backend.make_key(name)])
    with backend.lock(name, ttl=30) as handle:
        assert handle.fencing_token > max(tokens) and tokens == sorted(set(tokens))


@pytest.mark.parametrize("alias", ["mysql-lease", "mysql-tx"])
def test_a_name_pruned_and_used_again_gets_higher_tokens(alias: str, unique) -> None:
    test_prune.pruned_and_used_again(alias, unique)


@pytest.mark.parametrize("alias", ["mysql-lease", "mysql-tx"])
def test_pruning_in_a_loop_never_repeats_a_token(alias: str, unique, tmp_path: Path) -> None:
    test_prune.pruning_in_a_loop(alias, unique, tmp_path)


def test_a_transaction_mode_holder_is_skipped_by_the_prune(unique) -> None:
    """Its row is locked by the holder's transaction: the prune skips it rather than wait
    for it (a wait would end in a lock wait timeout, an error), though the row looks
    idle (the holder's grant is not committed)."""
    backend, name = locks["mysql-tx"], unique("tx-held")
    with backend.lock(name):
        pass  # the row exists, idle
    time.sleep(0.05)
    with transaction.atomic(using="mysql"), backend.lock(name):
        in_thread(lambda: backend.prune(idle_for=0))  # raises if it waited
        with connections["mysql"].cursor() as cursor:
            cursor.execute("SELECT 1 FROM django_distlock_lock WHERE name = %s",
                           [backend.make_key(name)])
            assert cursor.fetchone() is not None


def test_the_grant_leaves_the_callers_last_insert_id(unique) -> None:
    """The grant draws its token with an INSERT; the caller's LAST_INSERT_ID() is its own
    again after the acquire."""
    backend = locks["mysql-tx"]
    with transaction.atomic(using="mysql"), connections["mysql"].cursor() as cursor:
        cursor.execute("SELECT LAST_INSERT_ID(424242)")
        with backend.lock(unique()):
            cursor.execute("SELECT LAST_INSERT_ID()")
            assert cursor.fetchone()[0] == 424242



def test_the_admin_names_the_vendor_and_the_mode() -> None:
    assert backend_label(locks["mysql-tx"]) == "MySQL/MariaDB (transaction)"


@pytest.mark.django_db(transaction=True, databases=DATABASES)  # the migration graph: every app
def test_the_migration_unapplied_leaves_nothing_and_applies_again() -> None:
    """``migrate django_distlock zero`` on MariaDB drops the token table and the grant's
    procedure with the tables; ``migrate`` makes them again, the name column binary."""
    from django.db.migrations.executor import MigrationExecutor

    connection = connections["mysql"]

    def schema() -> tuple[list[str], list[str], str | None]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema ="
                " DATABASE() AND table_name IN ('django_distlock_lock', 'django_distlock_token',"
                " 'django_distlock_waiter', 'django_distlock_session_grant',"
                " 'django_distlock_session_epoch', 'django_distlock_session_start')"
                " ORDER BY 1")
            tables = [row[0] for row in cursor.fetchall()]
            cursor.execute(
                "SELECT routine_name FROM information_schema.routines WHERE routine_schema ="
                " DATABASE() AND routine_name LIKE 'django\\_distlock\\_%%' ORDER BY 1")
            routines = [row[0] for row in cursor.fetchall()]
            cursor.execute(
                "SELECT collation_name FROM information_schema.columns WHERE table_schema ="
                " DATABASE() AND table_name = 'django_distlock_lock' AND column_name = 'name'")
            found = cursor.fetchone()
        return tables, routines, found[0] if found else None

    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    try:
        executor.migrate([("django_distlock", None)])
        assert schema() == ([], [], None)
    finally:
        MigrationExecutor(connection).migrate(leaves)
    assert schema() == (
        ["django_distlock_lock", "django_distlock_session_epoch",
         "django_distlock_session_grant", "django_distlock_session_start",
         "django_distlock_token", "django_distlock_waiter"],
        [f"django_distlock_{name}" for name in (
            "acquire", "extend", "force", "prune", "recompute", "release", "session_force",
            "session_open", "session_take", "take", "tx_grant", "wait")],
        "utf8mb4_nopad_bin")
    with transaction.atomic(using="mysql"), locks["mysql-tx"].lock("after-migrate") as handle:
        assert handle.fencing_token


#: The MariaDB database the flash sale runs in (created when missing).
FLASHSALE_DATABASE = "distlock_flashsale"


@pytest.mark.servers
def test_flashsale_on_mariadb() -> None:
    """``DISTLOCK_DEMO_DATABASE=mysql manage.py flashsale``: every strategy on MariaDB
    (lease and transaction mode, optimistic, fenced writes) sells exactly the stock."""
    db = connections["mysql"].settings_dict
    side = mysql_side("mysql")
    try:
        side.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {FLASHSALE_DATABASE} "
                              "CHARACTER SET utf8mb4")
    finally:
        side.close()
    env = test_flashsale._env(
        DISTLOCK_DEMO_DATABASE="mysql", DISTLOCK_MYSQL_HOST=db["HOST"],
        DISTLOCK_MYSQL_PORT=str(db["PORT"]), DISTLOCK_MYSQL_USER=db["USER"],
        DISTLOCK_MYSQL_NAME=FLASHSALE_DATABASE,
    )
    stdout, rows = test_flashsale._flashsale(env)
    assert f"database mysql ({FLASHSALE_DATABASE})" in stdout, stdout
    test_flashsale._check(stdout, rows)


# -- system checks ------------------------------------------------------------------------


def _ids(messages: list) -> list[str]:
    return sorted(message.id for message in messages)


@pytest.mark.parametrize(("isolation", "expected"), [
    ("read uncommitted", ["distlock.E050"]), ("repeatable read", ["distlock.W050"]),
    ("serializable", ["distlock.W050"]), ("read committed", []), (None, []),
])
def test_transaction_mode_checks_the_isolation_level(isolation, expected, monkeypatch) -> None:
    options = {"charset": "utf8mb4", "isolation_level": isolation}
    monkeypatch.setitem(connections["mysql"].settings_dict, "OPTIONS", options)
    assert _ids(locks["mysql-tx"].check()) == expected
    assert _ids(locks["mysql-lease"].check()) == []  # lease mode reads apart from it


def test_a_charset_other_than_utf8mb4_is_reported(monkeypatch) -> None:
    monkeypatch.setitem(connections["mysql"].settings_dict, "OPTIONS", {"charset": "latin1"})
    assert _ids(locks["mysql-lease"].check()) == ["distlock.W057"]


@contextlib.contextmanager
def _global(variable: str, value: object) -> Iterator[None]:
    side = mysql_side("mysql")
    try:
        cursor = side.cursor()
        cursor.execute(f"SELECT @@GLOBAL.{variable}")
        (was,) = cursor.fetchone()
        cursor.execute(f"SET GLOBAL {variable} = %s", [value])
        try:
            yield
        finally:
            cursor.execute(f"SET GLOBAL {variable} = %s", [was])
    finally:
        side.close()


def test_the_deploy_check_reads_the_servers_durability() -> None:
    """``check --deploy`` asks the server (one round trip): a commit not flushed to the
    log may be lost with the machine, and a fencing token with it."""
    with _global("innodb_flush_log_at_trx_commit", 1):
        assert _ids(locks["mysql-lease"].check(deploy=True)) == []
    with _global("innodb_flush_log_at_trx_commit", 2):
        assert _ids(locks["mysql-tx"].check(deploy=True)) == ["distlock.W055"]


def test_session_modes_deploy_check_reads_the_servers_keepalives() -> None:
    """Session mode: the suite's server sets the keepalives the docs advise (5 s idle):
    nothing to say; at 0 (the OS' two hours) a vanished holder's lock outlives it that
    long, which the check says."""
    with _global("innodb_flush_log_at_trx_commit", 1):
        assert _ids(locks["mysql-session"].check(deploy=True)) == []
        with _global("tcp_keepalive_time", 0):
            assert _ids(locks["mysql-session"].check(deploy=True)) == ["distlock.W062"]


def test_the_deploy_check_reports_a_lock_table_without_row_locks() -> None:
    """Aria (MariaDB's MyISAM, whose keys stop short of the name's) has no row locks and
    no transactions: the check names the engine. (Aria indexes no virtual column: the
    held rows' indexes go while it is Aria.)"""
    indexes = {"distlock_held_idx": "held_name",
               "distlock_held_acquired_idx": "held_acquired_at, name",
               "distlock_held_expires_idx": "held_expires_at, name"}
    with connections["mysql"].cursor() as cursor:
        cursor.execute("ALTER TABLE django_distlock_lock "
                       + ", ".join(f"DROP INDEX {index}" for index in indexes)
                       + ", ENGINE = Aria")
        try:
            with _global("innodb_flush_log_at_trx_commit", 1):
                messages = locks["mysql-lease"].check(deploy=True)
        finally:
            cursor.execute("ALTER TABLE django_distlock_lock ENGINE = InnoDB, "
                           + ", ".join(f"ADD INDEX {index} ({columns})"
                                       for index, columns in indexes.items()))
    assert _ids(messages) == ["distlock.E051"]
    assert "Aria" in messages[0].msg


@pytest.mark.parametrize(("version", "old"), [
    ("10.11.19-MariaDB-0+deb12u1", False), ("10.5.27-MariaDB", True), ("10.6.0-MariaDB", False),
    ("8.0.36", False), ("8.0.0-dmr", True), ("5.7.44-log", True), ("9.1.0", False),
])
def test_server_versions_older_than_served_are_told(version: str, old: bool) -> None:
    from django_distlock.backends.database.mysql_checks import _too_old

    assert _too_old(version) is old


def test_a_short_wait_timeout_is_reported_for_lease_mode() -> None:
    """Sessions idle past ``wait_timeout`` are closed by the server, and their grants'
    bells with them: lease mode is told (transaction mode holds its connection busy)."""
    with _global("innodb_flush_log_at_trx_commit", 1), _global("wait_timeout", 60):
        assert _ids(locks["mysql-lease"].check(deploy=True)) == ["distlock.W056"]
        assert _ids(locks["mysql-tx"].check(deploy=True)) == []


# What MariaDB here cannot be made to be (a binary log needs a restart with it; Group
# Replication is MySQL's): the checks' reading of the variables such a server shows.
_SERVED = {"version": "8.0.36", "innodb_rollback_on_timeout": "OFF",
           "innodb_flush_log_at_trx_commit": "1", "wait_timeout": "28800", "log_bin": "ON",
           "binlog_format": "ROW", "skips_log": True}


@pytest.mark.parametrize(("variables", "session"), [
    ({}, []),
    ({"sync_binlog": "1"}, []),
    ({"sync_binlog": "1", "skips_log": False}, ["distlock.W061", "distlock.W064"]),
    ({"skips_log": False}, ["distlock.W064"]),
    ({"skips_log": False, "log_bin": "OFF"}, []),
    ({"sync_binlog": "1", "log_bin": "OFF"}, []),
    ({"binlog_format": "STATEMENT"}, ["distlock.E056"]),
    ({"tcp_keepalive_time": "0"}, ["distlock.W062"]),
    ({"tcp_keepalive_time": "7200"}, ["distlock.W062"]),
    ({"tcp_keepalive_time": "5"}, []),
    ({"wsrep_on": "ON"}, ["distlock.E053"]),
    ({"group_replication_group_name": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
      "group_replication_single_primary_mode": "OFF", "super_read_only": "OFF"},
     ["distlock.E054"]),
])
def test_what_the_server_variables_tell_session_mode(variables: dict, session: list) -> None:
    """Session mode's named locks are each server's (Galera refuses them; a multi-primary
    group's members would each grant), each grant's row goes to the binary log (flushed
    with sync_binlog=1), and a vanished holder keeps its lock as long as the server's
    keepalives take."""
    from django_distlock.backends.database.mysql_checks import checks_of

    found = {**_SERVED, **variables}
    assert _ids(checks_of(locks["mysql-session"], found, "InnoDB")) == session


@pytest.mark.parametrize(("variables", "lease", "tx"), [
    ({}, [], []),
    ({"binlog_format": "STATEMENT"}, ["distlock.E056"], ["distlock.E056"]),
    ({"binlog_format": "STATEMENT", "log_bin": "OFF"}, [], []),
    ({"binlog_format": "MIXED"}, [], []),
    ({"skips_log": False}, ["distlock.W064"], []),  # the waiters' rows: lease mode's
    ({"skips_log": False, "log_bin": "OFF"}, [], []),
    ({"group_replication_group_name": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
      "group_replication_single_primary_mode": "ON", "super_read_only": "OFF"}, [], []),
    ({"group_replication_group_name": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
      "group_replication_single_primary_mode": "ON", "super_read_only": "ON"},
     ["distlock.E054"], ["distlock.E054"]),
    ({"group_replication_group_name": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
      "group_replication_single_primary_mode": "OFF", "super_read_only": "OFF"},
     ["distlock.E054"], ["distlock.W060"]),
    ({"group_replication_group_name": ""}, [], []),
])
def test_what_the_server_variables_of_mysql_8_tell(variables: dict, lease: list,
                                                   tx: list) -> None:
    from django_distlock.backends.database.mysql_checks import checks_of

    found = {**_SERVED, **variables}
    assert _ids(checks_of(locks["mysql-lease"], found, "InnoDB")) == lease
    assert _ids(checks_of(locks["mysql-tx"], found, "InnoDB")) == tx


# -- MariaDB restarted from its data dir under holders -------------------------------------


@pytest.fixture(scope="module")
def private_mariadb() -> Iterator[MariaDB]:
    """One private MariaDB for the module (its install and start cost seconds)."""
    require_mysql()
    own = MariaDB()
    own.start()
    try:
        yield own
    finally:
        own.stop()


def test_a_private_servers_backends_open_their_sessions_on_it(private_mariadb: MariaDB) -> None:
    """The restarts below act on the backends' own sessions: those are new connections
    made from the handler's settings, which ``borrowed()`` points at the private server
    too (it once changed the wrapper's alone, and the restarts hit no session)."""
    with private_mariadb.borrowed() as alias:
        backend = private_mariadb.backend(alias, "session")
        try:
            session = backend.session_factory.open()
            with session.mutex:
                port = session.execute("SELECT @@port", None).fetchone()
            session.close()
        finally:
            backend.close()
    assert port == (private_mariadb.port,)


def test_mariadb_restarted_from_disk_under_holders(private_mariadb: MariaDB, unique) -> None:
    """SIGKILL of the server, started again on its data dir: a lease outlives it (a waiter
    queued before it is not granted until the holder's release, which reconnects), and
    tokens go on above every one before it, also for a name whose row was pruned before
    the crash (the token counter alone remembers it: a rolled-back draw or a crash never
    gives a value again, the counter survives a restart)."""
    with private_mariadb.borrowed() as alias:
        backend = private_mariadb.backend(alias)
        try:
            pruned, before = unique("pruned"), []
            for _ in range(3):  # short leases: the row is idle once they end
                with backend.lock(pruned, ttl=0.05) as handle:
                    before.append(handle.fencing_token)
            time.sleep(0.1)
            assert backend.prune(idle_for=0) == 1
            name = unique("restarted")
            _every_session_ended("mysql-lease", backend, name, private_mariadb.restart)
            again = backend.lock(pruned, ttl=30)
            assert _acquire_retrying(again, blocking=False)
            assert again.fencing_token > max(before), (again.fencing_token, before)
            again.release()
        finally:
            backend.close()


def test_mariadb_restarted_under_a_session_mode_holder(private_mariadb: MariaDB, unique) -> None:
    """Session mode: the restart ends every session and its named locks; the holder's
    release reports the loss, the name is free, and tokens (``UUID_SHORT()``, which
    starts from the server's start time) go on above every one before it."""
    with private_mariadb.borrowed() as alias:
        backend = private_mariadb.backend(alias, "session")
        try:
            _every_session_ended("mysql-session", backend, unique("restarted"),
                                 private_mariadb.restart)
        finally:
            backend.close()


def test_a_statement_format_binary_log_refuses_the_backends_writes_as_its_check_says(
    private_mariadb: MariaDB, unique,
) -> None:
    """A binary log in STATEMENT format takes no InnoDB row written at READ COMMITTED
    (1665), the level of the backend's own sessions (and Django's default): lease mode
    grants nothing, transaction mode makes no row, session mode draws no epoch for its
    tokens. ``check --deploy`` says so, an error for every mode (it once warned of
    unsafe statements in lease and session mode alone)."""
    with private_mariadb.borrowed():
        pass  # migrated before (such a log refuses Django's own migration record too)
    with private_mariadb.binary_log("--binlog-format=STATEMENT"), \
            private_mariadb.borrowed() as alias:
        for mode in ("lease", "transaction", "session"):
            backend = private_mariadb.backend(alias, mode)
            try:
                assert "distlock.E056" in _ids(backend.check(deploy=True)), mode
                with pytest.raises(DistLockError) as refused, transaction.atomic(alias):
                    backend.lock(unique(mode)).acquire(blocking=False)
                assert mysql_errno(refused.value.__cause__) == 1665, mode
            finally:
                backend.close()


def test_a_binary_log_takes_session_modes_holder_rows_from_a_user_that_may_not_keep_them_out(
    private_mariadb: MariaDB, unique,
) -> None:
    """MariaDB's binary log in its default MIXED format, flushed at every commit
    (``sync_binlog=1``). A database user that may set ``sql_log_bin`` (the suite's, with
    every privilege): its sessions' holder rows stay out of the log, and the run's epoch
    goes in (a replica, promoted, draws above it); ``check --deploy`` tells nothing. A
    user that may not (every privilege on the database alone): its tries (an ``INSERT``
    with a ``GET_LOCK`` in it, unsafe for a statement-based log) are logged as row
    changes, with no statement that takes a named lock for a replica to run and no
    warning in the server's log; ``check --deploy`` tells of the flush per grant
    (``W061``) and of what a replica's restart does to such rows (``W064``). The same
    for lease mode's waiters' rows (a wait's). (A change of the log needs a clean
    shutdown: after a crash with it on, the server will not start without it.)"""
    private_mariadb.sql("CREATE USER IF NOT EXISTS 'plain'@'127.0.0.1'")
    private_mariadb.sql("GRANT ALL ON distlock.* TO 'plain'@'127.0.0.1'")
    with private_mariadb.borrowed():
        pass  # migrated before: the log below holds the grants' statements alone
    with private_mariadb.binary_log("--binlog-format=MIXED", "--sync-binlog=1") as binlog:
        server_log = Path(private_mariadb.entry["log"])
        logged_before = server_log.stat().st_size  # the log goes on across the restarts

        def decoded() -> str:
            files = sorted(str(path) for path in binlog.parent.glob(binlog.name + ".0*"))
            return subprocess.run(
                ["mariadb-binlog", "--base64-output=decode-rows", "--verbose", *files],
                capture_output=True, text=True, check=True).stdout

        told = {}
        for user in ("distlock", "plain"):
            with private_mariadb.borrowed(user=user) as alias:
                backend = private_mariadb.backend(alias, "session")
                try:
                    told[user] = _ids(backend.check(deploy=True))
                    name, sessions = unique("logged"), set()
                    for grant in range(3):  # each by another context: each writes its row
                        handle = backend.lock(name)
                        with holder_context(f"grant {grant}"):
                            assert handle.acquire(blocking=False)
                        sessions.add(handle._hold.acquisition.taken)
                        handle.release()
                    (session,) = sessions
                    with session.mutex:
                        counted = dict(session.execute(
                            "SHOW SESSION STATUS WHERE Variable_name = 'Com_insert_select'",
                            None).fetchall())
                    assert counted == {"Com_insert_select": "2"}  # the first was the call
                finally:
                    backend.close()
                lease, waiter = private_mariadb.backend(alias), private_mariadb.backend(alias)
                try:
                    told[user + " lease"] = _ids(lease.check(deploy=True))
                    with lease.lock(name, ttl=30):  # a wait in the server: its row
                        assert not in_thread(functools.partial(
                            waiter.lock(name, ttl=30).acquire, timeout=0.3))
                finally:
                    lease.close()
                    waiter.close()
            if user == "distlock":  # the row changes in the log so far, by table
                changed = {line.split("`")[3] for line in decoded().splitlines()
                           if line.startswith(("### INSERT", "### UPDATE", "### DELETE"))}
                assert "django_distlock_session_grant" not in changed
                assert "django_distlock_waiter" not in changed
                assert "django_distlock_lock" in changed  # lease mode's rows: logged
                assert {"django_distlock_session_epoch", "django_distlock_session_start"} \
                    <= changed  # the run's epoch: logged
        assert told == {"distlock": [], "plain": ["distlock.W061", "distlock.W064"],
                        "distlock lease": [], "plain lease": ["distlock.W064"]}
        logged = decoded()
        assert "### INSERT INTO `distlock`.`django_distlock_waiter`" in logged
        # The tries overwrite their slot's row: row changes, the statement only as the
        # comment MariaDB annotates them with (#Q>), which a replica does not run.
        assert "### UPDATE `distlock`.`django_distlock_session_grant`" in logged
        assert [line for line in logged.splitlines()
                if "GET_LOCK" in line.upper() and not line.startswith("#")] == []
        assert b"Unsafe statement" not in server_log.read_bytes()[logged_before:]


def test_a_replica_promoted_after_session_mode_grants_goes_on_above_their_tokens(
    private_mariadb: MariaDB, unique,
) -> None:
    """A failover and back. The primary's session-mode grants; its replica promoted (no
    restart) and granting in its place; the old primary restarted and following the new
    one; then promoted again. Each server received the other's writes to the tables
    behind the tokens (the counter of epochs; the runs' rows, a ``MEMORY`` table), but
    its ``UUID_SHORT()`` is its own (its ``server_id`` in the top byte): a token made
    from another's base was out of range (error 1690, this test's first promotion) or
    some 2**56 too high. Each server's first grant after taking over draws an epoch
    above the other's, so tokens go on above every one given before; and the old
    primary, which lost its ``MEMORY`` rows in its restart, goes on replicating (a row
    event deleting a row it lost once stopped it with error 1032)."""

    def tokens(server: MariaDB) -> list[int]:
        with server.borrowed() as alias:
            backend = server.backend(alias, "session")
            try:
                given = []
                for _ in range(3):
                    with backend.lock(name) as handle:
                        given.append(handle.fencing_token)
                return given
            finally:
                backend.close()

    name = unique("failover")
    replica = MariaDB()
    replica.start()
    try:
        with replica.borrowed():
            pass  # migrated, as the primary is
        with private_mariadb.binary_log("--server-id=2", "--binlog-format=ROW"), \
                replica.binary_log("--binlog-format=ROW"):
            with private_mariadb.borrowed():
                pass
            replica.follow(private_mariadb)
            first = tokens(private_mariadb)
            replica.promote(private_mariadb)
            private_mariadb.restart(signum=signal.SIGTERM)  # its MEMORY rows gone
            private_mariadb.follow(replica)
            second = tokens(replica)
            private_mariadb.promote(replica)  # replicated all of it: no error 1032
            third = tokens(private_mariadb)
        for before, after in ((first, second), (second, third)):
            assert min(after) > max(before), (first, second, third)
        assert first + second + third == sorted(set(first + second + third))
    finally:
        replica.stop()


def test_a_replica_that_restarts_stops_at_holder_rows_unless_they_are_kept_from_it(
    private_mariadb: MariaDB, unique,
) -> None:
    """What ``W064`` tells, on real servers. A replica that restarts loses its copy of
    session mode's holder rows (a ``MEMORY`` table). A user that may set ``sql_log_bin``
    keeps them out of the log: the restarted replica goes on. A user that may not has
    them logged: the restarted replica stops at the first replicated delete of a row it
    lost (error 1032: a new session's sweep of the rows of sessions gone). Restarted to
    ignore the table, as the warning's hint says, it goes on past that event, and past
    another restart."""
    private_mariadb.sql("CREATE USER IF NOT EXISTS 'plain'@'127.0.0.1'")
    private_mariadb.sql("GRANT ALL ON distlock.* TO 'plain'@'127.0.0.1'")
    name = unique("replicated")

    def grants(user: str) -> None:
        with private_mariadb.borrowed(user=user) as alias:
            backend = private_mariadb.backend(alias, "session")
            try:
                for _ in range(3):
                    with backend.lock(name):
                        pass
            finally:
                backend.close()

    replica = MariaDB()
    replica.start()
    try:
        for server in (replica, private_mariadb):
            with server.borrowed():
                pass  # both migrated before the log begins
        with private_mariadb.binary_log("--server-id=2", "--binlog-format=ROW"):
            replica.follow(private_mariadb)
            grants("distlock")
            replica.restart(signum=signal.SIGTERM)  # its MEMORY rows gone
            grants("distlock")
            assert replica.caught_up(private_mariadb), replica.replication()
            # The rows of those sessions were never logged: gone without a trace, as
            # the plain user's sessions would not delete them so (see W064's text).
            private_mariadb.sql("SET SESSION sql_log_bin = 0",
                                "DELETE FROM distlock.django_distlock_session_grant")
            grants("plain")
            assert replica.caught_up(private_mariadb), replica.replication()
            replica.restart(signum=signal.SIGTERM)
            grants("plain")
            assert not replica.caught_up(private_mariadb, seconds=3)
            stopped = replica.replication()
            assert (stopped["Slave_SQL_Running"], stopped["Last_SQL_Errno"]) == ("No", 1032)
            assert "Delete_rows" in stopped["Last_SQL_Error"]
            assert "django_distlock_session_grant" in stopped["Last_SQL_Error"]
            replica.restart([*replica.entry["argv"],
                             "--replicate-ignore-table=distlock.django_distlock_session_grant"],
                            signal.SIGTERM)
            assert replica.caught_up(private_mariadb), replica.replication()
            replica.restart(signum=signal.SIGTERM)
            grants("plain")
            assert replica.caught_up(private_mariadb), replica.replication()
    finally:
        replica.stop()


def test_mariadb_restarted_from_disk_under_every_kind(private_mariadb: MariaDB, unique) -> None:
    """The same restart while readers, a writer and permits hold (test_hostile_kinds_servers'
    scenario): each survives it, nobody else comes in until they are released, a writer's
    token after it exceeds every one before."""
    with private_mariadb.borrowed() as alias:
        backend, other = private_mariadb.backend(alias), private_mariadb.backend(alias)
        try:
            figures = _restart_while_held(backend, other, unique("kinds"),
                                          private_mariadb.restart)
        finally:
            backend.close()
            other.close()
    record("restart-kinds", "mysql-lease (restart)", processes=1, **figures)


# -- the held rows' indexes: generated columns (MySQL has no partial indexes) ---------------


def _mysql_seed(rows: int) -> None:
    """``rows`` held leases (acquired 1 ms apart, expiring in an hour) and as many free
    rows, written directly."""
    digits = " UNION ALL ".join(f"SELECT {i}" for i in range(10))
    with connections["mysql"].cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_distlock_lock (name, owner, fencing, acquired_at, expires_at,"
            f" host, pid, thread) WITH d(v) AS ({digits}),"
            " g(n) AS (SELECT 1 + a.v + 10 * b.v + 100 * c.v + 1000 * e.v + 10000 * f.v"
            " FROM d a, d b, d c, d e, d f)"
            " SELECT CONCAT('l:scale:', n), IF(n %% 2, CONCAT('o', n),"
            " NULL), 1, UTC_TIMESTAMP(6) - INTERVAL n * 1000 MICROSECOND,"
            " UTC_TIMESTAMP(6) + INTERVAL (3600000 + n) * 1000 MICROSECOND, 'h', 1, 't'"
            " FROM g WHERE n <= %s",
            [2 * rows])
        cursor.execute("ANALYZE TABLE django_distlock_lock")
        cursor.fetchall()


def _mysql_analyzed(statement: str, params: list[Any]) -> dict[str, Any]:
    """MariaDB's ANALYZE FORMAT=JSON of ``statement`` (run): its table's access."""
    with connections["mysql"].cursor() as cursor:
        cursor.execute("ANALYZE FORMAT=JSON " + statement, params)
        plan = json.loads(cursor.fetchone()[0])["query_block"]
    assert "filesort" not in json.dumps(plan), plan  # the index gives the order
    [access] = plan["nested_loop"]
    return dict(access["table"])


@pytest.mark.parametrize("order", ["acquired", "expires"])
def test_a_page_is_one_index_range_on_mariadb(order: str) -> None:
    """With 20,000 held rows and 20,000 free ones, a page of 50 reads 50 entries of the
    generated column's index (NULL while free: never read), no sort (probe P12); so does
    a page from a cursor in the middle (the range starts at its time)."""
    _mysql_seed(20_000)
    first = "0001-01-01 00:00:00"
    with connections["mysql"].cursor() as cursor:
        cursor.execute(f"SELECT {order}_at, name FROM django_distlock_lock WHERE owner IS NOT"
                       f" NULL ORDER BY {order}_at, name LIMIT 1 OFFSET 10000")
        at, key = cursor.fetchone()
    for cursor_at, cursor_key in ((first, ""), (at.strftime("%Y-%m-%d %H:%M:%S.%f"), key)):
        access = _mysql_analyzed(
            age_statement("mysql", order),
            ["l:", upper_bound("l:"), cursor_at, cursor_at, cursor_key, 50])
        assert access["key"] == f"distlock_held_{order}_idx", access
        assert access["r_rows"] <= 51, access  # a tie on the cursor's time reads one more


def test_the_name_listing_is_one_index_range_on_mariadb() -> None:
    _mysql_seed(20_000)
    access = _mysql_analyzed(MYSQL.held, ["", "l:", upper_bound("l:"), 50])
    assert access["key"] == "distlock_held_idx", access
    assert access["r_rows"] == 50, access


def test_django_has_no_warning_for_the_models_indexes_on_mysql() -> None:
    """Django warns (models.W037) on every migrate for a conditional index on MySQL,
    which has none: the held rows' indexes are the migration's, per vendor."""
    from django_distlock.models import LockRecord, LockShare

    assert [m.id for m in LockRecord.check(databases=["mysql"])] == []
    assert [m.id for m in LockShare.check(databases=["mysql"])] == []
