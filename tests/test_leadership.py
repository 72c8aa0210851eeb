"""Leadership in one process (``django_distlock.leadership``): terms follow each other
with growing epochs on every backend that can lead, a lost term is told (``lost``,
``wait_lost``, ``await_lost``, ``on_lost``, ``check()``) and refuses fenced writes, the
backends that cannot lead are refused saying why, and the runner's arguments are checked
before it campaigns. OS processes, kills and pauses: ``test_leadership_processes.py``."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command

from django_distlock import locks
from django_distlock.exceptions import (
    LeadershipLost,
    LockLost,
    LockTimeout,
    StaleFencingToken,
    UnsupportedOperation,
)
from django_distlock.leadership import (
    LEADER_PREFIX,
    Leader,
    current_leader,
    leader,
    leadership,
)
from django_distlock.singleton import run_singleton
from django_distlock.testing.contract.support import in_thread

from .conftest import LIBRARY_DB, require_alias
from .testapp.fencing_models import FencedItem

pytestmark = LIBRARY_DB

#: One alias per backend (and database mode) that can lead.
LEADERS = ["locmem", "sqlite-lease", "pg-lease", "mysql-lease", "redis", "redis-cluster", "zk"]
#: And those that cannot, with a word of why.
REFUSED = {
    "redlock": "counters cannot be ordered",
    "cache-memcached": "cannot keep growing",
    "cache-redis": "cannot keep growing",
    "sqlite-tx": "transaction open for the leader's whole life",
    "pg-tx": "transaction open for the leader's whole life",
    "pg-session": "no lease to count down",
    "mysql-session": "no lease to count down",
}


@pytest.mark.parametrize("alias", LEADERS)
def test_terms_follow_each_other_with_growing_epochs(alias: str, unique) -> None:
    require_alias(alias)
    name = unique("lead")
    epochs = []
    for _ in range(2):
        with leadership(name, using=alias, ttl=5) as term:
            assert not term.lost and term.name == name and term.alias == alias
            remaining = term.remaining
            assert remaining is not None and 0 < remaining <= 5
            epochs.append(term.epoch)
            # another candidate waits its turn
            with pytest.raises(LockTimeout, match="another process leads it"):
                in_thread(lambda: leadership(name, using=alias, timeout=0.2).__enter__())
            if locks[alias].supports_listing:
                info = current_leader(name, using=alias)
                assert info is not None
                assert (info.epoch, info.host, info.pid) == (
                    term.epoch, socket.gethostname(), os.getpid()
                )
                assert info.name == name and info.since is not None
                assert (info.expires_at is None) == (alias == "zk")
        assert not term.lost
        with pytest.raises(LeadershipLost, match="is over"):
            term.check()
    assert epochs[1] > epochs[0]
    if locks[alias].supports_listing:
        assert current_leader(name, using=alias) is None
        held = {info.name for info in locks[alias].held_locks(prefix=LEADER_PREFIX + name)}
        assert held == set()


@pytest.mark.parametrize("alias", LEADERS)
def test_a_term_taken_away_is_lost_told_and_fences_no_more(alias: str, unique) -> None:
    """An operator's force release ends the term: the renewal (or ZooKeeper's watch on
    the node) finds it, ``wait_lost`` returns, ``on_lost`` is called once, a fenced
    write with the term is refused before any query and one with its epoch by the
    database once a newer term wrote; the exit does not raise (the leader was told)."""
    require_alias(alias)
    name = unique("taken")
    item = FencedItem.objects.create(label=name)
    called = []
    with leadership(name, using=alias, ttl=1.5) as term:
        term.on_lost(called.append)
        assert FencedItem.objects.filter(pk=item.pk).fenced_update(term, stock=1) == 1
        assert not term.wait_lost(timeout=0.05)
        assert locks[alias].force_release(LEADER_PREFIX + name)
        assert term.wait_lost(timeout=5)
        assert term.lost and term.remaining == 0
        with pytest.raises(LeadershipLost):
            FencedItem.objects.filter(pk=item.pk).fenced_update(term, stock=2)
        with leadership(name, using=alias, timeout=5) as newer:  # in this thread: its own
            assert newer.epoch > term.epoch
            FencedItem.objects.filter(pk=item.pk).fenced_update(newer, stock=3)
        with pytest.raises(StaleFencingToken):
            FencedItem.objects.filter(pk=item.pk).fenced_update(term.epoch, stock=4)
        deadline = time.monotonic() + 5
        while not called and time.monotonic() < deadline:
            time.sleep(0.01)
    assert called == [term]
    item.refresh_from_db()
    assert item.stock == 3


@pytest.mark.parametrize("alias", ["pg-lease", "redis", "zk"])
def test_a_term_is_listed_with_its_epoch_and_who_leads(alias: str, unique) -> None:
    """``manage.py distlock list`` (and the admin's held-locks page, which reads the same
    listing) shows a term: the lock ``leader:<name>``, its epoch as the fencing token,
    the leader's host and pid, and "leader of <name>" as what it is doing."""
    require_alias(alias)
    name = unique("listed")
    with leadership(name, using=alias) as term:
        out = StringIO()
        call_command("distlock", "list", "--alias", alias, "--prefix", LEADER_PREFIX + name,
                     "--json", stdout=out)
        listed = json.loads(out.getvalue())["locks"]
    assert [(i["name"], i["fencing_token"], i["host"], i["pid"], i["context"])
            for i in listed] == [
        (LEADER_PREFIX + name, term.epoch, socket.gethostname(), os.getpid(),
         f"leader of {name}")
    ]


def test_a_loss_nobody_looked_at_raises_at_the_exit(unique) -> None:
    name = unique("unchecked")
    term = leadership(name, using="locmem", ttl=0.6)
    with pytest.raises(LeadershipLost, match="did not check") as caught, term:
        locks["locmem"].force_release(LEADER_PREFIX + name)
        time.sleep(0.5)  # a renewal (every 0.2 s) has found it gone
    assert isinstance(caught.value.__cause__, LockLost)
    # the block's own error is not replaced
    with pytest.raises(ZeroDivisionError), leadership(name, using="locmem", ttl=0.6):
        locks["locmem"].force_release(LEADER_PREFIX + name)
        time.sleep(0.5)
        1 / 0  # noqa: B018


def test_wait_lost_returns_ahead_of_the_lease_end_and_on_timeout(unique) -> None:
    """``ahead``: True once the lease has that little left unless renewed; renewals
    every third keep two thirds left, so an ``ahead`` over that is True at once."""
    with leadership(unique("ahead"), using="locmem", ttl=0.9) as term:
        started = time.monotonic()
        assert not term.wait_lost(timeout=0.5, ahead=0.1)  # renewed all along
        assert time.monotonic() - started >= 0.5
        assert term.wait_lost(timeout=5, ahead=0.85)
        assert not term.lost  # about to end, not lost


def test_wait_lost_checks_its_arguments(unique) -> None:
    with leadership(unique("args"), using="locmem") as term:
        for bad in (-1, float("nan"), True, "1"):
            with pytest.raises((TypeError, ValueError)):
                term.wait_lost(timeout=0, ahead=bad)
        with pytest.raises(ValueError):
            term.wait_lost(timeout=-1)
        with pytest.raises(TypeError):
            term.on_lost("print")  # type: ignore[arg-type]


@pytest.mark.parametrize("alias", ["locmem", "redis", "zk"])
def test_an_async_term_is_told_on_its_event_loop(alias: str, unique) -> None:
    require_alias(alias)
    name = unique("async")

    async def lead() -> tuple[bool, bool, float]:
        async with leadership(name, using=alias, ttl=1.5) as term:
            early = await term.await_lost(timeout=0.05)
            threading.Timer(0.1, locks[alias].force_release, [LEADER_PREFIX + name]).start()
            started = time.monotonic()
            told = await term.await_lost(timeout=5)
            return early, told, time.monotonic() - started

    early, told, took = asyncio.run(lead())
    assert (early, told) == (False, True)
    # Told by the next renewal (a third of the ttl) or check of the node (a third of
    # ZooKeeper's 4 s session), plus its round trip: not at the wait's timeout.
    assert took < (4 if alias == "zk" else 1.5) / 3 + 1.0


@pytest.mark.parametrize("alias", REFUSED)
def test_backends_that_cannot_lead_are_refused_saying_why(alias: str) -> None:
    require_alias(alias)
    why = REFUSED[alias]
    with pytest.raises(UnsupportedOperation, match=why):
        leadership("x", using=alias)
    with pytest.raises(UnsupportedOperation, match=why):
        leader("x", using=alias)
    with pytest.raises(UnsupportedOperation, match=why):
        current_leader("x", using=alias)


def test_a_campaign_runs_a_function_per_term_until_stopped(unique) -> None:
    name = unique("campaign")
    stop = threading.Event()
    epochs: list[int] = []

    def lead(term) -> None:
        epochs.append(term.epoch)
        if len(epochs) == 3:
            stop.set()

    candidate = Leader(name, using="locmem", ttl=5)
    candidate.campaign(lead, stop=stop)
    assert candidate.terms == 3 and epochs == sorted(set(epochs))
    with pytest.raises(TypeError):
        candidate.campaign("lead")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        candidate.campaign(lead, poll=0)


def test_the_runner_checks_its_arguments_before_campaigning(unique) -> None:
    name = unique("runner")
    with pytest.raises(TypeError, match="non-empty list"):
        run_singleton(name, "celery beat", using="locmem")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty list"):
        run_singleton(name, [], using="locmem")
    with pytest.raises(ValueError, match="grace must be"):
        run_singleton(name, ["true"], using="locmem", grace=0)
    with pytest.raises(ValueError, match="must fit in 2 s"):
        run_singleton(name, ["true"], using="locmem", ttl=6, grace=1.6)
    with pytest.raises(UnsupportedOperation, match="cannot hold a leadership term"):
        run_singleton(name, ["true"], using="sqlite-tx")
    with pytest.raises(UnsupportedOperation, match="main thread"):
        in_thread(lambda: run_singleton(name, ["true"], using="locmem"))
    assert not locks["locmem"].is_locked(LEADER_PREFIX + name)


def test_the_runner_returns_the_status_of_a_command_that_ends(unique) -> None:
    """A command that ends by itself ends the run (its status), and the term with it."""
    name = unique("ends")
    lines: list[str] = []
    status = run_singleton(
        name, ["sh", "-c", 'test "$DISTLOCK_LEADER" = "$0" && exit 3', name],
        using="locmem", ttl=3, grace=0.2, say=lines.append,
    )
    assert status == 3, lines
    assert any("epoch" in line for line in lines) and not locks["locmem"].is_locked(
        LEADER_PREFIX + name
    )
