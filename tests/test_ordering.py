"""The lock-order checker (``django_distlock.ordering``, ``DISTLOCK_CHECK_ORDER``): two
lock classes taken in both orders raise or warn before any server call, naming both
orders and where each was first seen, also through longer chains; classes from
``order_class=``, ``@distlock`` templates or names; what records nothing (try-locks,
one class, multi_lock, reentrant handles); the setting's defaults and check; and the
pytest plugin failing a test that inverted an order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import override_settings

from django_distlock import distlock, locks, ordering
from django_distlock.checks import check_distlock
from django_distlock.contrib.audit.models import LockEvent
from django_distlock.exceptions import LockOrderViolation
from django_distlock.ordering import GRAPH, LockOrderWarning, lock_class

from .conftest import LIBRARY_DB

pytestmark = [pytest.mark.django_versions, LIBRARY_DB]

HERE = Path(__file__).name
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def raising() -> Iterator[None]:
    GRAPH.reset()
    with override_settings(DISTLOCK_CHECK_ORDER="raise"):
        yield
    GRAPH.reset()  # what the test found on purpose does not fail it (the plugin)


def take(*names: str, **options: object) -> None:
    """Hold ``names`` one inside the other, in this order, then let them go."""
    handles = [locks["locmem"].lock(name, timeout=1, **options) for name in names]
    try:
        for handle in handles:
            assert handle.acquire()
    finally:
        for handle in reversed(handles):
            if handle.held:
                handle.release()


def test_a_class_is_the_name_with_its_variable_parts_out() -> None:
    assert lock_class("order:42") == "order:*"
    assert lock_class("stock:7/eu") == "stock:*/eu"
    assert lock_class("user:3f2a-77b1:cart") == "user:*-*:cart"
    assert lock_class("report.2026-11-29") == "report.*-*-*"
    assert lock_class("nightly import") == "nightly import"


def test_the_reverse_of_a_seen_order_raises_before_any_server_call(raising: None) -> None:
    take("order:1", "stock:1")
    with pytest.raises(LockOrderViolation) as caught:
        take("stock:2", "order:2")
    message = str(caught.value)
    assert "acquiring 'order:*' while holding 'stock:*'" in message
    assert "'order:*' then 'stock:*' at" in message and HERE in message
    assert not locks["locmem"].is_locked("order:2")  # refused before the acquire
    assert [(o.first, o.then) for o in GRAPH.orders()] == [("order:*", "stock:*")]
    take("order:3", "stock:3")  # the order seen first is fine


def test_a_longer_cycle_is_found(raising: None) -> None:
    take("a:1", "b:1")
    take("b:2", "c:2")
    with pytest.raises(LockOrderViolation, match="'a:\\*' -> 'b:\\*' -> 'c:\\*'"):
        take("c:3", "a:3")  # closes a -> b -> c -> a


def test_templates_and_order_class_name_the_classes(raising: None) -> None:
    @distlock("invoice:{pk}", using="locmem", timeout=1)
    def bill(pk: int) -> None:
        take(f"batch-{pk}", order_class="batch")

    bill(1)
    assert [(o.first, o.then) for o in GRAPH.orders()] == [("invoice:{pk}", "batch")]
    batch = locks["locmem"].lock("nightly", order_class="batch")
    with batch, pytest.raises(LockOrderViolation, match=r"'invoice:\{pk\}' while holding"):
        bill(2)


def test_what_records_no_order(raising: None) -> None:
    take("p:1", "p:2")  # one class
    with locks["locmem"].lock("q:1"):
        tried = locks["locmem"].lock("r:1", blocking=False)  # a try-lock cannot wait
        assert tried.acquire()
        tried.release()
    reentrant = locks["locmem"].lock("s:1", reentrant=True)
    with reentrant, reentrant:  # acquired again: no order with itself
        pass
    with locks["locmem"].multi_lock(["u:1", "t:1"]):  # sorted by multi_lock itself
        pass
    assert GRAPH.orders() == []
    with locks["locmem"].multi_lock(["u:2", "t:2"]):
        take("v:2")  # but what is taken while a multi_lock holds is recorded
    assert {(o.first, o.then) for o in GRAPH.orders()} == {("t:*", "v:*"), ("u:*", "v:*")}


def test_warn_mode_warns_at_the_callers_line_and_goes_on() -> None:
    GRAPH.reset()
    with override_settings(DISTLOCK_CHECK_ORDER="warn"):
        take("m:1", "n:1")
        with pytest.warns(LockOrderWarning, match="acquiring 'm:\\*' while holding") as seen:
            take("n:2", "m:2")  # acquired all the same
    assert seen[0].filename.endswith(HERE)
    GRAPH.reset()


def test_the_mode_defaults_to_warn_under_debug_and_off_otherwise() -> None:
    GRAPH.reset()
    take("d:1", "e:1")
    assert GRAPH.orders() == []  # DEBUG is False in tests: off
    with override_settings(DEBUG=True):
        take("d:2", "e:2")
        assert ordering.MODE == "warn" and len(GRAPH.orders()) == 1
    with override_settings(DEBUG=True, DISTLOCK_CHECK_ORDER=False):
        take("e:3", "d:3")
    GRAPH.reset()
    with override_settings(DISTLOCK_CHECK_ORDER="always"):
        assert [m.id for m in check_distlock() if m.id == "distlock.E007"] == ["distlock.E007"]


def test_the_pytest_plugin_fails_a_test_that_inverted_an_order(tmp_path: Path) -> None:
    (tmp_path / "test_inverted.py").write_text(
        "from django.test import override_settings\n"
        "from django_distlock import locks\n"
        "def test_inverts():\n"
        "    with override_settings(DISTLOCK_CHECK_ORDER='warn'):\n"
        "        for first, then in (('f:1', 'g:1'), ('g:2', 'f:2')):\n"
        "            with locks['locmem'].lock(first), locks['locmem'].lock(then):\n"
        "                pass\n"
        "def test_fine():\n"
        "    with locks['locmem'].lock('h:1'):\n"
        "        pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
         "ignore::django_distlock.ordering.LockOrderWarning", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    # The fixture fails the test at its teardown: pytest reports that as an error.
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed, 1 error" in done.stdout, done.stdout
    assert "ERROR" in done.stdout and "test_inverted.py::test_inverts" in done.stdout
    assert "Lock order inverted during this test" in done.stdout


def test_warnings_filters_may_make_the_warning_an_error() -> None:
    GRAPH.reset()
    with override_settings(DISTLOCK_CHECK_ORDER="warn"), warnings.catch_warnings():
        warnings.simplefilter("error", LockOrderWarning)
        take("j:1", "k:1")
        with pytest.raises(LockOrderWarning):
            take("k:2", "j:2")
    assert not locks["locmem"].is_locked("j:2") and not locks["locmem"].is_locked("k:2")
    GRAPH.reset()


# -- orders across processes: past holds, the audit trail, manage.py distlock order ------


def _hold(holder: str, name: str, start: int, end: int) -> ordering.PastHold:
    at = datetime(2026, 11, 30, tzinfo=UTC)
    return ordering.PastHold(holder, name, at + timedelta(seconds=start),
                             at + timedelta(seconds=end))


def test_orders_in_past_holds_count_each_hold_begun_inside_another_of_its_holder() -> None:
    holds = [
        _hold("a", "order:1", 0, 10), _hold("a", "stock:1", 1, 2), _hold("a", "stock:2", 3, 4),
        _hold("a", "order:2", 11, 12),  # after order:1 ended: no order
        _hold("a", "order:3", 5, 6),  # one class held twice: no order
        _hold("b", "stock:9", 0, 5), _hold("b", "invoice:9", 1, 2),  # another holder
    ]
    holds.sort(key=lambda h: (h.holder, h.start))
    seen = ordering.orders_in(holds)
    assert [(o.first, o.then, o.count) for o in seen] == [
        ("order:*", "stock:*", 2), ("stock:*", "invoice:*", 1)]
    assert seen[0].example.name == "stock:1"  # the first hold that made it
    assert ordering.inversions((o.first, o.then) for o in seen) == []


def test_inversions_are_the_cycles_each_once_from_its_smallest_class() -> None:
    assert ordering.inversions([("b", "a"), ("a", "b")]) == [["a", "b", "a"]]
    assert ordering.inversions([("a", "b"), ("b", "c"), ("c", "a"), ("x", "y")]) == [
        ["a", "b", "c", "a"]]
    assert ordering.inversions([("a", "b"), ("b", "c"), ("a", "c")]) == []


def _take_elsewhere(first: str, second: str) -> int:
    database = connections["default"].settings_dict
    done = subprocess.run(
        [sys.executable, "-m", "tests.order_taker",
         json.dumps({"ENGINE": database["ENGINE"], "NAME": str(database["NAME"]),
                     "OPTIONS": {"timeout": 20}}), first, second],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_distlock_order_finds_an_inversion_across_processes_in_the_audit_trail() -> None:
    """Two processes, each with the checker off and each seeing one order only: the
    command reads both from the audit trail, names the inversion, and --check exits 1."""
    assert connections["default"].vendor == "sqlite"  # the helper writes to its file
    LockEvent.objects.all().delete()
    GRAPH.reset()
    first = _take_elsewhere("order:41", "stock:41")
    second = _take_elsewhere("stock:42", "order:42")
    out = StringIO()
    call_command("distlock", "order", stdout=out)
    text = out.getvalue()
    assert "Orders seen in this process:\n  none" in text
    assert "order:* -> stock:*, 1 time; first at " in text and f"pid {first} " in text
    assert "stock:* -> order:*, 1 time; first at " in text and f"pid {second} " in text
    assert "INVERTED: order:* -> stock:* -> order:*" in text
    with pytest.raises(CommandError) as failed:
        call_command("distlock", "order", "--check", stdout=StringIO())
    assert failed.value.returncode == 1
    out = StringIO()
    call_command("distlock", "order", "--json", stdout=out)
    found = json.loads(out.getvalue())["the audit trail"]
    assert found["inversions"] == [["order:*", "stock:*", "order:*"]]
    LockEvent.objects.all().delete()


def test_distlock_order_prints_this_process_graph(raising: None) -> None:
    take("order:1", "stock:1")
    out = StringIO()
    call_command("distlock", "order", "--check", "--json", stdout=out)  # no inversion
    found = json.loads(out.getvalue())["this process"]
    assert [(o["first"], o["then"]) for o in found["orders"]] == [("order:*", "stock:*")]
    assert HERE in found["orders"][0]["where"] and found["violations"] == []


def test_distlock_order_names_this_process_violations_and_check_fails() -> None:
    """The checker records no inverting order (it refuses it): the command reports what
    it found from its violations, and --check exits 1 on them."""
    GRAPH.reset()
    with override_settings(DISTLOCK_CHECK_ORDER="warn"), pytest.warns(LockOrderWarning):
        take("order:1", "stock:1")
        take("stock:2", "order:2")
    try:
        out = StringIO()
        with pytest.raises(CommandError) as failed:
            call_command("distlock", "order", "--check", "--since", "0.001", stdout=out)
        assert failed.value.returncode == 1
        assert "INVERTED: Lock order inverted: acquiring 'order:*' while holding " \
            "'stock:*'" in out.getvalue()
    finally:
        GRAPH.reset()  # found on purpose: the plugin must not fail this test
