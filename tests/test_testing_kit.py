"""The testing kit (``django_distlock.testing``: hold_elsewhere, make_lost,
backend_unavailable, the history fixture), used on every real backend, through the
``distlock_*`` fixtures of the installed pytest plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from django.test import TransactionTestCase

from django_distlock import locks
from django_distlock.exceptions import (
    BackendUnavailable,
    LockLost,
    LockNotHeld,
    UnsupportedOperation,
)
from django_distlock.testing import LockTestMixin, hold_elsewhere, make_lost

from .conftest import (
    DATABASES,
    LIBRARY_DB,
    eventually,
    needs_pg,
    require_mysql,
    require_pg,
    require_redis,
    require_zookeeper,
)

pytestmark = [
    pytest.mark.django_versions,
    LIBRARY_DB,
]

LEASES = ["sqlite-lease", "pg-lease", "redis", "redis-cache", "redlock", "zk"]
TRANSACTIONS = ["sqlite-tx", "pg-tx"]
SERVERS = ["default", *LEASES, *TRANSACTIONS]


def require(alias: str) -> None:
    """Fail or skip unless the server behind ``alias`` runs."""
    if needs_pg(alias):
        require_pg()
    elif alias.startswith("redis"):
        require_redis()
    elif alias == "redlock":
        require_redis(redlock=True)
    elif alias == "zk":
        require_zookeeper()
    elif alias.startswith("mysql"):
        require_mysql()


def free(alias: str, name: str) -> bool:
    """Whether this process can take ``name`` at once (released again if so)."""
    handle = locks[alias].lock(name)
    if not handle.acquire(blocking=False):
        return False
    handle.release()
    return True


@pytest.mark.parametrize("alias", SERVERS)
def test_hold_elsewhere_holds_the_lock_in_another_process_until_the_block_ends(
    alias: str, unique, distlock_hold_elsewhere
) -> None:
    require(alias)
    name = unique("elsewhere")
    with distlock_hold_elsewhere(name, using=alias) as holder:
        assert holder.alive and holder.pid != os.getpid()
        assert holder.owner_id
        if locks[alias].supports_fencing:
            assert isinstance(holder.fencing_token, int)
        assert locks[alias].is_locked(name)
        assert not free(alias, name)
    assert not holder.alive
    assert free(alias, name)


@pytest.mark.parametrize("alias", ["pg-tx", "pg-session", "mysql-session", "zk", "sqlite-tx"])
def test_a_killed_holder_frees_a_lock_that_lives_with_its_session(
    alias: str, unique, distlock_hold_elsewhere
) -> None:
    require(alias)
    name = unique("killed")
    holder = distlock_hold_elsewhere(name, using=alias)
    holder.kill()
    assert not holder.alive
    # ZooKeeper: the session ends after its timeout (4 s in the tests' settings).
    assert eventually(lambda: free(alias, name), 15)


def test_hold_elsewhere_refuses_a_process_local_backend(unique) -> None:
    with pytest.raises(UnsupportedOperation, match="one process"):
        hold_elsewhere(unique(), using="locmem")


@pytest.mark.django_db  # the test runs inside a transaction
def test_hold_elsewhere_says_sqlite_needs_a_transaction_test_case(unique) -> None:
    with pytest.raises(UnsupportedOperation, match="TransactionTestCase"):
        hold_elsewhere(unique(), using="sqlite-lease")


@pytest.mark.django_db(databases=DATABASES)  # a transaction, but PostgreSQL leases are apart
def test_hold_elsewhere_works_inside_a_transaction_on_postgresql(unique) -> None:
    require_pg()
    name = unique()
    with hold_elsewhere(name, using="pg-lease"):
        assert not free("pg-lease", name)
    assert free("pg-lease", name)


@pytest.mark.parametrize("alias", ["locmem", *LEASES])
def test_make_lost_takes_the_lock_from_its_holder(alias: str, unique, distlock_make_lost) -> None:
    require(alias)
    name = unique("lost")
    handle = locks[alias].lock(name, ttl=30)
    assert handle.acquire(timeout=5)
    distlock_make_lost(handle)
    assert not locks[alias].is_locked(name)  # freed on the server
    if locks[alias].distributed:
        with hold_elsewhere(name, using=alias) as other:  # and another owner takes it
            assert other.owner_id != handle.owner_id
    with pytest.raises(LockLost):
        handle.release()
    assert handle.lost


def test_expire_session_loses_every_lock_of_the_session(
    unique, distlock_expire_session, distlock_hold_elsewhere
) -> None:
    require_zookeeper()
    held = [locks["zk"].lock(unique(f"session{i}")) for i in range(2)]
    for handle in held:
        assert handle.acquire(timeout=5)
    distlock_expire_session("zk")
    for handle in held:
        assert handle.lost
        with distlock_hold_elsewhere(handle.name, using="zk"):  # free for others
            pass
        with pytest.raises(LockLost):
            handle.release()
    with locks["zk"].lock(unique("after"), timeout=5) as handle:  # a new session
        assert handle.held


def test_expire_session_is_for_zookeeper(distlock_expire_session) -> None:
    with pytest.raises(UnsupportedOperation, match="make_lost"):
        distlock_expire_session("locmem")


@pytest.mark.parametrize("alias", TRANSACTIONS)
def test_make_lost_says_why_a_transaction_lock_cannot_be_taken(
    alias: str, unique, distlock_make_lost
) -> None:
    require(alias)
    with locks[alias].lock(unique()) as handle:
        with pytest.raises(UnsupportedOperation, match="holder's transaction"):
            distlock_make_lost(handle)
        assert handle.held


def test_make_lost_needs_a_held_handle(unique) -> None:
    with pytest.raises(LockNotHeld):
        make_lost(locks["locmem"].lock(unique()))


@pytest.mark.parametrize("alias", SERVERS)
def test_backend_unavailable_fails_every_call_and_the_backend_works_after(
    alias: str, unique, distlock_backend_unavailable
) -> None:
    require(alias)
    name = unique("down")
    kept = locks[alias].lock(unique("kept"))
    assert kept.acquire(timeout=5)
    if alias.endswith("-tx"):  # a transaction lock: one at a time per connection
        kept.release()
    real = locks[alias]
    with distlock_backend_unavailable(alias) as broken:
        assert locks[alias] is broken and broken is not real
        with pytest.raises(BackendUnavailable) as info:
            locks[alias].lock(name).acquire(blocking=False)
        assert info.value.__cause__ is not None  # chained to the client's own error
        with pytest.raises(BackendUnavailable):
            locks[alias].health()
    assert locks[alias] is real
    locks[alias].health()
    with locks[alias].lock(name, timeout=5) as handle:
        assert handle.held
    if kept.held:  # held before the block, on the real backend: still held
        kept.release()


def test_backend_unavailable_refuses_a_process_local_backend(
    distlock_backend_unavailable,
) -> None:
    with pytest.raises(UnsupportedOperation, match="locks live in this process"):
        distlock_backend_unavailable("locmem").__enter__()
    handle = locks["locmem"].lock("free")
    assert handle.acquire(blocking=False)
    handle.release()


@pytest.mark.django_db  # the test runs inside a transaction
def test_backend_unavailable_will_not_cut_the_database_under_a_transaction(
    distlock_backend_unavailable,
) -> None:
    real = locks["default"]
    with pytest.raises(UnsupportedOperation, match="TransactionTestCase"):
        distlock_backend_unavailable("default").__enter__()
    assert locks["default"] is real  # nothing was swapped
    assert not locks["default"].is_locked("never-taken")


def test_the_history_fixture_checks_a_real_history(distlock_history, unique) -> None:
    name = unique("history")
    for _ in range(3):
        with distlock_history.hold(locks["sqlite-lease"].lock(name, ttl=30)):
            pass
    report = distlock_history.check()
    assert report.holds == 3 and report.overlaps == []


class MixinTests(LockTestMixin, TransactionTestCase):
    """The same kit for ``manage.py test`` users."""

    databases = {"default"}

    def test_hold_elsewhere_and_make_lost(self) -> None:
        with self.hold_elsewhere("mixin:held", using="sqlite-lease"):
            self.assertFalse(locks["sqlite-lease"].lock("mixin:held").acquire(blocking=False))
        handle = locks["sqlite-lease"].lock("mixin:held")
        self.assertTrue(handle.acquire(blocking=False))
        self.make_lost(handle)
        with self.assertRaises(LockLost):
            handle.release()

    def test_backend_unavailable(self) -> None:
        with self.backend_unavailable("sqlite-lease"), self.assertRaises(BackendUnavailable):
            locks["sqlite-lease"].lock("mixin:down").acquire(blocking=False)
        locks["sqlite-lease"].health()

    def test_lock_history_catches_an_overlap(self) -> None:
        history = self.lock_history()
        first, second = history.invoke("mixin:x"), history.invoke("mixin:x")
        history.granted(first)
        history.granted(second)  # a made-up second holder while the first holds
        history.released(first)
        history.released(second)
        with self.assertRaisesRegex(AssertionError, "overlap"):
            self.assertHistoryOK(history)


# -- the plugin, as a project with none of our conftest sees it -------------------------

_PROJECT_TEST = '''
import sys

def test_fixtures_are_there_and_nothing_heavy_was_imported(
    distlock_hold_elsewhere, distlock_make_lost, distlock_backend_unavailable,
    distlock_expire_session,
):
    from django.conf import settings

    assert "django_distlock.testing.pytest_plugin" in sys.modules
    heavy = [m for m in sys.modules if m.split(".")[0] in ("redis", "kazoo", "psycopg")]
    assert heavy == [] and "django.db.models" not in sys.modules
    assert not settings.configured

def test_a_made_up_overlap(distlock_history):
    first, second = distlock_history.invoke("x"), distlock_history.invoke("x")
    distlock_history.granted(first)
    distlock_history.granted(second)
    distlock_history.released(first)
    distlock_history.released(second)

def test_one_hold_after_another(distlock_history):
    for _ in range(2):
        op = distlock_history.invoke("x")
        distlock_history.granted(op)
        distlock_history.released(op)
'''


def test_the_installed_plugin_loads_by_its_entry_point(tmp_path: Path) -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("django_distlock") == "django_distlock.testing.pytest_plugin", (
        "The package's pytest11 entry point is not installed in this interpreter: "
        "reinstall the package (pip install -e .)."
    )
    (tmp_path / "test_project.py").write_text(textwrap.dedent(_PROJECT_TEST))
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    # No conftest, no -p, no Django settings: a project that does not use Django.
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), str(tmp_path / "test_project.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    out = run.stdout + run.stderr
    assert "3 passed, 1 error" in out, out
    assert "ERROR at teardown of test_a_made_up_overlap" in out, out
    assert "overlap" in out.split("ERROR at teardown")[1], out


def test_the_contract_closes_the_connections_its_event_loops_opened(unique) -> None:
    """``asyncio.run`` runs a transaction-mode acquire's sync part on asgiref's executor
    thread, whose Django connection stays open after the loop (and past the test
    database's teardown: "being accessed by other users"). The contract's clean-up
    closed this thread's connections instead (``async_to_sync`` runs its sync calls here)."""
    import asyncio

    from asgiref.sync import SyncToAsync
    from django.db import connections

    from django_distlock.testing.contract.support import close_async_connections

    require_pg()
    backend = locks["pg-tx"]

    async def main() -> None:
        async with backend.lock(unique(), timeout=5):
            pass

    def executor_connected() -> bool:
        return SyncToAsync.single_thread_executor.submit(
            lambda: connections[backend.database].connection is not None
        ).result()

    asyncio.run(main())
    assert executor_connected()
    close_async_connections()
    assert not executor_connected()
