"""The pytest plugin of django-distlock, active once the package is installed (entry point
``pytest11``). It adds fixtures, all named ``distlock_*``, around the testing kit:

- ``distlock_hold_elsewhere(name, using="default", ttl=60, timeout=10)``: another OS
  process holds the lock (until its ``with`` ends, or the test does);
- ``distlock_make_lost(handle)``: take the lock away from its holder;
- ``distlock_expire_session(using="default")``: end the process' ZooKeeper session;
- ``distlock_backend_unavailable(using="default")``: a ``with`` block in which the
  alias' lock server cannot be reached;
- ``distlock_history``: a history recorder in ``tmp_path``, checked for overlaps at
  the end of the test (or earlier with ``.check()``).

And one fixture every test gets (autouse): a test during which the lock-order checker
(``DISTLOCK_CHECK_ORDER``, ``django_distlock.ordering``) found two lock classes taken in
both orders fails, naming both, whether the checker raises or only warns.

Loading it reads no Django setting and imports no model, no lock backend and no
Redis, ZooKeeper or PostgreSQL client (only the package's own light modules); the
fixtures import what they need when a test uses them. A project that does not use
them, or does not use Django settings at all, is not affected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .checked import CheckedHistory
    from .elsewhere import Elsewhere


@pytest.fixture
def distlock_hold_elsewhere() -> Iterator[Callable[..., Elsewhere]]:
    """Return ``hold_elsewhere(name, using="default", ttl=60, timeout=10)``: a forked
    process holds the lock once it returns; released at the ``with`` exit, or at the
    end of the test (see :func:`django_distlock.testing.elsewhere.hold_elsewhere`)."""
    from .elsewhere import hold_elsewhere

    holders: list[Elsewhere] = []

    def start(name: str, using: str = "default", ttl: float = 60, timeout: float = 10) -> Any:
        holder = hold_elsewhere(name, using, ttl, timeout)
        holders.append(holder)
        return holder

    yield start
    problems = []
    for holder in holders:  # every one, even after one failed
        try:
            holder.release()
        except AssertionError as exc:
            problems.append(str(exc))
    if problems:
        raise AssertionError("; ".join(problems))


@pytest.fixture
def distlock_make_lost() -> Callable[[Any], None]:
    """Return ``make_lost(handle)``, which takes the lock away from its holder ``handle``
    (see :func:`django_distlock.testing.faults.make_lost`)."""
    from .faults import make_lost

    return make_lost


@pytest.fixture
def distlock_expire_session() -> Callable[..., None]:
    """Return ``expire_session(using="default", timeout=10)``, which ends this process'
    ZooKeeper session on the servers: every lock it holds there is lost (see
    :func:`django_distlock.testing.faults.expire_session`)."""
    from .faults import expire_session

    return expire_session


@pytest.fixture
def distlock_backend_unavailable() -> Callable[..., Any]:
    """Return ``backend_unavailable(using="default")``, a context manager in which the
    alias' server cannot be reached and lock calls raise ``BackendUnavailable`` (see
    :func:`django_distlock.testing.faults.backend_unavailable`)."""
    from .faults import backend_unavailable

    return backend_unavailable


@pytest.fixture
def distlock_history(tmp_path: Path) -> Iterator[CheckedHistory]:
    """A :class:`~django_distlock.testing.checked.CheckedHistory` on
    ``tmp_path / "distlock-history.jsonl"`` for the test and the processes it forks;
    at the end of the test, a history with events must pass ``check()`` (set its
    ``invariant`` for a business rule; its ``check_at_end`` False to skip that)."""
    from .checked import CheckedHistory

    history = CheckedHistory(tmp_path / "distlock-history.jsonl")
    yield history
    history.close()
    if history.check_at_end and history.events():
        history.check()


@pytest.fixture(autouse=True)
def _distlock_lock_order() -> Iterator[None]:
    """Fail a test during which the lock-order checker found a violation (``"warn"``
    mode too). Nothing is imported here when the package's ordering module is not."""
    import sys

    ordering = sys.modules.get("django_distlock.ordering")
    before = len(ordering.violations()) if ordering is not None else 0
    yield
    ordering = sys.modules.get("django_distlock.ordering")
    if ordering is not None:
        found = ordering.violations()[before:]
        if found:
            pytest.fail("Lock order inverted during this test:\n" + "\n".join(found),
                        pytrace=False)
