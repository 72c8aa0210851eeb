"""The shipped contract itself: its unittest form runs under a unittest runner (as
``manage.py test`` runs it) on real backends, and its capability checks fail a backend
whose flags lie. Also the base class' template methods every backend now relies on."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import SimpleTestCase, TransactionTestCase, override_settings

from django_distlock import locks, signals
from django_distlock.backends.base import BaseLockBackend, Freed, LockPage
from django_distlock.backends.locmem import LocMemAcquisition, LocMemBackend
from django_distlock.exceptions import UnsupportedOperation
from django_distlock.kinds import Kind
from django_distlock.testing.contract import BackendContractTests, check_names

pytestmark = pytest.mark.django_versions


# Run by manage.py test below, not collected by pytest (``__test__``).
class LocMemContractTests(BackendContractTests, SimpleTestCase):
    __test__ = False
    alias = "locmem"


class SQLiteLeaseContractTests(BackendContractTests, TransactionTestCase):
    __test__ = False
    alias = "sqlite-lease"
    databases = {"default"}


def _run(case: type[unittest.TestCase], *names: str) -> unittest.TestResult:
    """Run ``case`` (its tests ``names``, or all) with unittest's own runner."""
    loader = unittest.TestLoader()
    if names:
        suite = unittest.TestSuite(case(name) for name in names)
    else:
        suite = loader.loadTestsFromTestCase(case)
    return unittest.TextTestRunner(stream=_Null(), verbosity=0).run(suite)


class _Null:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def _failed(result: unittest.TestResult) -> list[str]:
    return [test.id().rsplit(".", 1)[-1] for test, _ in result.failures + result.errors]


#: The checks the TransactionTestCase form runs under ``manage.py test``: those that
#: write, list, wait across threads and processes, and run async, on its test database
#: (every check runs on SQLite lease mode in test_backend_database.py's pytest form).
SQLITE_SAMPLE = ("acquire_release", "waiter_gets_the_lock_when_released",
                 "fencing_token_strictly_increases", "held_locks_pages", "force_release",
                 "distributed_locks_exclude_another_process", "async_acquire_release")


def test_the_unittest_form_runs_under_manage_py_test(tmp_path: Path) -> None:
    """``manage.py test`` (Django's runner, its own test database) runs every check on
    locmem (a SimpleTestCase), and on SQLite lease mode (a TransactionTestCase) the
    checks that use its database."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "DISTLOCK_SQLITE_DIR": str(tmp_path)}
    cases = [f"{__name__}.{LocMemContractTests.__name__}", *(
        f"{__name__}.{SQLiteLeaseContractTests.__name__}.test_{name}"
        for name in SQLITE_SAMPLE)]
    done = subprocess.run(
        [sys.executable, "manage.py", "test", "--settings=tests.settings", "-v", "2", *cases],
        cwd=root, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    assert f"Ran {len(check_names()) + len(SQLITE_SAMPLE)} tests" in done.stderr
    assert "\nOK\n" in done.stderr  # not "OK (skipped=...)"
    assert set(SQLITE_SAMPLE) <= set(check_names())


def test_both_forms_have_the_same_tests() -> None:
    from django_distlock.testing.contract import LockContract

    pytest_tests = {name for name in dir(LockContract) if name.startswith("test_")}
    unittest_tests = {name for name in dir(BackendContractTests) if name.startswith("test_")}
    assert pytest_tests == unittest_tests == {f"test_{what}" for what in check_names()}
    assert len(check_names()) == len(set(check_names()))


# -- lying backends: each flag's check must fail the backend that lies about it -------


class ClaimsNoExpiry(LocMemBackend):
    supports_expiry = False  # its leases do end


class ClaimsNoFencing(LocMemBackend):
    supports_fencing = False  # it issues tokens


class ClaimsSharedOwner(LocMemBackend):
    supports_shared_owner = True  # its handles given one owner still exclude each other


class ClaimsReadWrite(LocMemBackend):
    # its readers take the exclusive lock: they do not share
    kinds = {kind: LocMemAcquisition for kind in (Kind.EXCLUSIVE, Kind.READ, Kind.WRITE)}


class ClaimsDowngrade(ClaimsReadWrite):
    supports_downgrade = True  # its write holder's read_lock waits for itself


class ClaimsSemaphores(LocMemBackend):
    # its permits take the exclusive lock: one holder, whatever the limit
    kinds = {Kind.EXCLUSIVE: LocMemAcquisition, Kind.SEMAPHORE: LocMemAcquisition}


class ClaimsDistributed(LocMemBackend):
    distributed = True  # a forked child has a copy of its memory


class ListsBeforeRefusing(LocMemBackend):
    """Says it cannot list, yet reaches its store before refusing."""

    supports_listing = False

    def held_locks(self, prefix: str = "", limit: int = 50, cursor: str | None = None) -> LockPage:
        self._held_locks(prefix, limit, cursor)
        return super().held_locks(prefix, limit, cursor)


LIES = [
    (ClaimsNoExpiry, "lease_expires_on_the_server"),
    (ClaimsNoFencing, "acquire_release"),
    (ClaimsNoFencing, "fencing_token_strictly_increases"),
    (ClaimsSharedOwner, "reentrant_owner_is_shared_by_handles"),
    (ClaimsReadWrite, "readers_share_and_writers_exclude"),
    (ClaimsDowngrade, "the_write_holder_reading_its_name"),
    (ClaimsSemaphores, "a_semaphore_admits_at_most_its_limit"),
    (ClaimsDistributed, "distributed_locks_exclude_another_process"),
    (ListsBeforeRefusing, "a_capability_it_lacks_is_refused_before_any_io"),
]


class LyingContractTests(BackendContractTests, SimpleTestCase):
    __test__ = False
    alias = "lying"


@pytest.mark.parametrize(("liar", "what"), LIES, ids=lambda v: getattr(v, "__name__", v))
def test_a_backend_whose_flags_lie_fails_the_contract(liar, what) -> None:
    """The check fails under the lie and passes on the honest locmem backend."""
    lying = {"BACKEND": f"{__name__}.{liar.__name__}", "LOCATION": uuid.uuid4().hex, "TTL": 30}
    with override_settings(DISTLOCK={**settings.DISTLOCK, "lying": lying}):
        assert type(locks["lying"]) is liar
        result = _run(LyingContractTests, f"test_{what}")
    assert not result.errors  # an assertion of the check failed, nothing else
    assert _failed(result) == [f"test_{what}"]
    assert _failed(_run(LocMemContractTests, f"test_{what}")) == []


# -- the base class' template methods --------------------------------------------------


def test_force_release_sends_the_signal_once_with_the_same_arguments(unique) -> None:
    backend = locks["locmem"]
    sent: list[dict[str, Any]] = []

    def receive(**kwargs: Any) -> None:
        sent.append(kwargs)

    signals.lock_force_released.connect(receive)
    try:
        handle = backend.lock(unique())
        handle.acquire()
        assert backend.force_release(handle.name) is True
        assert backend.force_release(handle.name) is False
        backend.lock(handle.name, blocking=False).acquire()  # the first handle was freed
        with signals.by_operator():  # the admin app's: an operator signal follows
            assert backend.force_release(handle.name) is True
    finally:
        signals.lock_force_released.disconnect(receive)
    sent_once = {
        "signal": signals.lock_force_released, "sender": LocMemBackend, "backend": backend,
        "alias": "locmem", "name": handle.name, "fencing_token": None,
    }
    assert sent == [{**sent_once, "by_operator": False}, {**sent_once, "by_operator": True}]


class CountsHooks(LocMemBackend):
    supports_listing = False
    supports_force_release = False
    hooks = 0

    def _held_locks(self, prefix: str, limit: int, cursor: str | None) -> LockPage:
        type(self).hooks += 1
        return super()._held_locks(prefix, limit, cursor)

    def _force_release(self, key: str, owner: str) -> Freed | None:
        type(self).hooks += 1
        return super()._force_release(key, owner)


def test_a_feature_whose_flag_is_off_is_refused_before_its_hook(unique) -> None:
    backend = CountsHooks("counts", {"LOCATION": uuid.uuid4().hex})
    with pytest.raises(UnsupportedOperation, match=r"CountsHooks \(alias 'counts'\) cannot list"):
        backend.held_locks()
    with pytest.raises(UnsupportedOperation, match="supports_force_release is False"):
        backend.force_release(unique())
    with pytest.raises(ValueError):  # arguments are still checked first
        backend.held_locks(limit=0)
    assert CountsHooks.hooks == 0


class NoOwnerKept(CountsHooks):
    supports_force_release = True
    supports_force_release_by_owner = False


def test_an_owner_is_refused_where_the_server_keeps_none(unique) -> None:
    """``force_release(name, owner=...)`` where ``supports_force_release_by_owner`` is
    False: refused before the hook (which would free whoever holds); without an owner,
    the hook runs."""
    backend = NoOwnerKept("no-owner", {"LOCATION": uuid.uuid4().hex})
    name = unique()
    handle = backend.lock(name)
    assert handle.acquire(blocking=False)
    NoOwnerKept.hooks = 0
    with pytest.raises(UnsupportedOperation, match="supports_force_release_by_owner is False"):
        backend.force_release(name, owner=handle.owner_id)
    assert NoOwnerKept.hooks == 0 and handle.held and backend.is_locked(name)
    assert backend.force_release(name) is True
    assert NoOwnerKept.hooks == 1 and not backend.is_locked(name)


def test_the_refusal_says_why_where_the_backend_says() -> None:
    from django_distlock.backends.redis import RedlockBackend

    backend = RedlockBackend("r", {"LOCATION": ["redis://a", "redis://b", "redis://c"]})
    with pytest.raises(UnsupportedOperation, match="no master knows which locks"):
        backend.held_locks()


class NoAcquisition(LocMemBackend):
    kinds = {}


class FlagBesideItsTable(LocMemBackend):
    supports_semaphore = True  # the flag is read from kinds, which serves no semaphore


class ListsNothing(LocMemBackend):
    _held_locks = BaseLockBackend._held_locks  # the base's: no listing, yet the flag is on


def test_a_backend_class_missing_a_promised_hook_cannot_be_built() -> None:
    with pytest.raises(TypeError, match=r"an acquisition class for Kind.EXCLUSIVE in kinds"):
        NoAcquisition("x", {})
    with pytest.raises(TypeError, match=r"supports_semaphore set beside its kinds table"):
        FlagBesideItsTable("x", {})
    with pytest.raises(TypeError, match=r"_held_locks\(\) \(supports_listing is True\)"):
        ListsNothing("x", {})
