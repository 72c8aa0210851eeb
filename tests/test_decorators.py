"""The ``distlock`` decorator and ``lock()``: key templates, policies, sync and async."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path

from django_distlock import distlock, lock, locks, signals
from django_distlock.exceptions import (
    InvalidLockAlias,
    InvalidLockName,
    LockLost,
    LockNotAcquired,
    LockTimeout,
    SelfDeadlock,
)
from django_distlock.http import conflict_response, locked_response
from django_distlock.values import DEFAULT

from .conftest import in_thread

pytestmark = [pytest.mark.django_versions, pytest.mark.django_db(transaction=True)]
ALIAS = "sqlite-lease"
LOCMEM = "django_distlock.backends.locmem.LocMemBackend"


def held_elsewhere(name: str) -> bool:
    """Whether another thread would find ``name`` held right now."""
    return in_thread(lambda: locks[ALIAS].lock(name).acquire(blocking=False)) is False


def test_template_from_bound_arguments_and_defaults() -> None:
    seen = []

    @distlock("stock:{product_id}:{size}", using=ALIAS)
    def buy(product_id, quantity=1, size="M"):
        seen.append(held_elsewhere(f"stock:{product_id}:{size}"))
        return quantity

    assert buy(42) == 1
    assert buy(product_id=7, size="L", quantity=3) == 3
    assert seen == [True, True]
    assert not held_elsewhere("stock:42:M")


def test_template_attribute_access() -> None:
    @distlock("user:{request.user.pk}", using=ALIAS)
    def view(request):
        return held_elsewhere(f"user:{request.user.pk}")

    request = SimpleNamespace(user=SimpleNamespace(pk=5))
    assert view(request) is True


def test_callable_key() -> None:
    @distlock(lambda order: f"order:{order['id']}", using=ALIAS)
    def pay(order):
        return held_elsewhere(f"order:{order['id']}")

    assert pay({"id": 9}) is True


def test_method_key_uses_self() -> None:
    class Account:
        pk = 3

        @distlock("account:{self.pk}", using=ALIAS)
        def debit(self):
            return held_elsewhere("account:3")

    assert Account().debit() is True


@pytest.mark.parametrize("template", ["order:{missing}", "order:{0}", "order:{}"])
def test_bad_template_refused_at_decoration(template: str) -> None:
    with pytest.raises(ValueError):

        @distlock(template, using=ALIAS)
        def pay(order_id):
            return order_id


def test_unknown_alias_is_clear() -> None:
    @distlock("x", using="nope")
    def func():
        return 1

    with pytest.raises(InvalidLockAlias, match="nope"):
        func()
    with pytest.raises(KeyError):
        lock("x", using="nope")


def _while_held(name: str, func):
    with locks[ALIAS].lock(name):
        return in_thread(func)


def test_on_fail_raise_skip_and_callable() -> None:
    calls = []

    @distlock("busy", using=ALIAS, timeout=0.1)
    def raising():
        calls.append("raising")

    @distlock("busy", using=ALIAS, blocking=False, on_fail="skip", skip_value="skipped")
    def skipping():
        calls.append("skipping")

    @distlock("busy:{n}", using=ALIAS, blocking=False, on_fail=lambda exc, n: ("failed", n, exc))
    def policy(n):
        calls.append("policy")

    def expect_timeout():
        with pytest.raises(LockTimeout):
            raising()
        return True

    assert _while_held("busy", expect_timeout)
    assert _while_held("busy", skipping) == "skipped"
    status, n, exc = _while_held("busy:1", lambda: policy(1))
    assert (status, n) == ("failed", 1) and isinstance(exc, LockNotAcquired)
    assert calls == []


@pytest.mark.parametrize(("policy", "status"), [(locked_response, 423), (conflict_response, 409)])
def test_view_policies(policy, status) -> None:
    @distlock("cart:{cart_id}", using=ALIAS, blocking=False, on_fail=policy)
    def view(request, cart_id):
        raise AssertionError("must not run")

    request = RequestFactory().post("/cart/1/")
    response = _while_held("cart:1", lambda: view(request, cart_id=1))
    assert response.status_code == status
    assert b"cart:1" in response.content and response["Retry-After"]


def test_exception_in_body_releases() -> None:
    @distlock("boom", using=ALIAS)
    def boom():
        raise KeyError("inside")

    with pytest.raises(KeyError):
        boom()
    assert not held_elsewhere("boom")


def test_async_function() -> None:
    @distlock("async:{n}", using=ALIAS)
    async def work(n):
        await asyncio.sleep(0)
        return n * 2

    @distlock("async:{n}", using=ALIAS, blocking=False, on_fail="skip", skip_value=-1)
    async def skip(n):
        return n

    async def main():
        assert await work(2) == 4
        async with lock("async:3", using=ALIAS):
            return await skip(3)

    assert asyncio.run(main()) == -1
    assert not held_elsewhere("async:2")


def test_async_view_policy() -> None:
    @distlock("av:{pk}", using=ALIAS, blocking=False, on_fail=locked_response)
    async def view(request, pk):
        return "ran"

    request = RequestFactory().get("/")
    response = _while_held("av:1", lambda: asyncio.run(view(request, pk=1)))
    assert response.status_code == 423
    assert asyncio.run(view(request, pk=2)) == "ran"


def test_lock_context_manager() -> None:
    with lock("ctx", using=ALIAS, ttl=5, timeout=1) as handle:
        assert handle.held and held_elsewhere("ctx")
    assert not handle.held


def test_a_locked_function_calling_another_that_locks_the_name() -> None:
    """Seed 001's reentrant use: with ``reentrant=True`` the inner call enters at once
    (counted: its lock_acquired carries the outer grant's fencing token) and the name
    is free after the outer call; without it the inner call raises SelfDeadlock."""
    acquired: list[tuple[str, int | None]] = []

    def remember(sender, name, fencing_token, **kwargs):
        acquired.append((name, fencing_token))

    @distlock("account:{account_id}", using=ALIAS, reentrant=True, timeout=1)
    def debit(account_id):
        return "debited"

    @distlock("account:{account_id}", using=ALIAS, reentrant=True, timeout=1)
    def transfer(account_id):
        assert held_elsewhere(f"account:{account_id}")
        return debit(account_id)

    signals.lock_acquired.connect(remember)
    try:
        assert transfer("7") == "debited"
    finally:
        signals.lock_acquired.disconnect(remember)
    mine = [token for name, token in acquired if name == "account:7"]
    assert len(mine) == 2 and mine[0] == mine[1] is not None
    assert not held_elsewhere("account:7")

    @distlock("account:{account_id}", using=ALIAS, timeout=1)
    def plain(account_id):
        return debit(account_id)  # reentrant inside, but the outer hold is not

    with pytest.raises(SelfDeadlock):
        plain("8")
    assert not held_elsewhere("account:8")


def test_nested_reentrant_blocks_and_the_alias_default() -> None:
    with lock("nest", using=ALIAS, reentrant=True) as outer:
        with lock("nest", using=ALIAS, reentrant=True, timeout=0) as inner:
            assert inner.fencing_token == outer.fencing_token
        assert outer.held and held_elsewhere("nest")
    assert not held_elsewhere("nest")
    reentrant = {**settings.DISTLOCK[ALIAS], "REENTRANT": True}
    with override_settings(DISTLOCK={**settings.DISTLOCK, "r": reentrant}):

        @distlock("nest:{n}", using="r", timeout=1)
        def inner(n):
            return n

        @distlock("nest:{n}", using="r", timeout=1)
        def outer_call(n):
            return inner(n)

        assert outer_call(3) == 3
        with pytest.raises(TypeError, match="reentrant must be True or False"):
            distlock("x:{n}", using="r", reentrant="yes")(inner)
        with pytest.raises(ValueError, match="semaphores are not reentrant"):
            distlock("x:{n}", using="r", kind="semaphore", limit=2, reentrant=True)(inner)


# -- item 11: everything static is checked when decorating --------------------------


def _decorate(key="order:{order_id}", **options):
    """Decorate a function named ``pay`` taking ``order_id``; return the wrapper."""

    @distlock(key, using=ALIAS, **options)
    def pay(order_id):
        return order_id

    return pay


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"ttl": -1}, ValueError, "ttl must be between"),
        ({"ttl": 0}, ValueError, "ttl must be between"),
        ({"ttl": float("nan")}, ValueError, "ttl must be between"),
        ({"ttl": "30"}, TypeError, "ttl must be a number"),
        ({"ttl": True}, TypeError, "ttl must be a number"),
        ({"timeout": -1}, ValueError, "timeout must be >= 0"),
        ({"timeout": "5"}, TypeError, "timeout must be a number"),
        ({"blocking": "yes"}, TypeError, "blocking must be True or False"),
        ({"blocking": None}, TypeError, "blocking must be True or False"),
        ({"using": None}, TypeError, "using must be"),
        ({"using": 42}, TypeError, "using must be"),
        ({"on_fail": "ignore"}, ValueError, "on_fail must be"),
        ({"on_fail": 42}, TypeError, "on_fail must be"),
    ],
)
def test_bad_option_refused_at_decoration_naming_template_and_function(
    options, error, says
) -> None:
    using = options.pop("using", ALIAS)
    with pytest.raises(error, match=says) as info:

        @distlock("order:{order_id}", using=using, **options)
        def pay(order_id):
            return order_id

    message = str(info.value)
    assert "'order:{order_id}'" in message
    assert "test_bad_option_refused_at_decoration_naming_template_and_function.<locals>.pay" in (
        message
    )


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("order:{order_id", "expected '}'"),
        ("order:order_id}", "Single '}'"),
        ("order:{order_id[}", "expected '}'"),
        ("order:{order_id.}", "Empty attribute"),
        ("order:{order_id!z}", "conversion"),
        ("order:{order_id:{width}}", "format spec"),
    ],
)
def test_malformed_template_says_so(template: str, says: str) -> None:
    with pytest.raises(ValueError, match="malformed") as info:
        _decorate(template)
    message = str(info.value)
    assert repr(template) in message and "_decorate.<locals>.pay" in message
    assert says in message


def test_template_without_fixed_text_refused() -> None:
    # "{order_id}" alone would make an empty name (a refused name) of an empty value.
    with pytest.raises(ValueError, match="fixed text") as info:
        _decorate("{order_id}")
    assert "_decorate.<locals>.pay" in str(info.value)
    assert _decorate("{order_id}:order")(1) == 1


def test_bad_key_refused_naming_function() -> None:
    with pytest.raises(TypeError, match=r"_decorate\.<locals>\.pay"):
        _decorate(42)


def test_defaults_and_none_timeout_accepted() -> None:
    assert _decorate(ttl=DEFAULT, timeout=DEFAULT)(1) == 1
    assert _decorate(ttl=0.5, timeout=None, blocking=False)(2) == 2


def test_alias_looked_up_at_call_time() -> None:
    @distlock("late:{n}", using="late")
    def late(n):
        return n

    with override_settings(DISTLOCK={"late": {"BACKEND": LOCMEM}}):
        assert late(1) == 1
    with pytest.raises(InvalidLockAlias, match="late"):
        late(2)


# -- item 11: values from the call never make a refused name ------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("a\x00b", "v:a\\x00b"),
        ("line\nbreak", "v:line\\x0abreak"),
        ("del\x7f", "v:del\\x7f"),
        ("c1\x85", "v:c1\\x85"),
        ("lone\ud800", "v:lone\\ud800"),
        ("back\\slash", "v:back\\\\slash"),
        ("\\x00", "v:\\\\x00"),
        ("plain / .. é 😀", "v:plain / .. é 😀"),
        (7, "v:7"),
    ],
)
def test_values_escaped_into_an_accepted_name(value, name) -> None:
    @distlock("v:{value}", using=ALIAS)
    def view(value):
        return held_elsewhere(name)

    assert view(value) is True
    assert view.lock_name(value) == name


def test_escaping_keeps_distinct_values_distinct() -> None:
    @distlock("v:{value}", using=ALIAS)
    def view(value):
        return value

    values = ["\x00", "\\x00", "\\\\x00", "\\", "\\\\", "\ud800", "\\ud800", "\n", "\\x0a", ""]
    names = [view.lock_name(value) for value in values]
    assert len(set(names)) == len(values)


def test_escaping_applies_to_attributes_items_conversions_and_specs() -> None:
    @distlock("k:{request.path}:{data[id]}:{data[tag]!r}:{n:>4}", using=ALIAS)
    def view(request, data, n=5):
        return n

    request = SimpleNamespace(path="/a\tb/")
    name = view.lock_name(request, {"id": "\x01", "tag": "t\\"})
    assert name == "k:/a\\x09b/:\\x01:'t\\\\\\\\':   5"
    assert view(request, {"id": "\x01", "tag": "t\\"}) == 5


def test_lock_name_follows_bind_semantics() -> None:
    @distlock("k:{a}:{b}:{c}:{rest}:{extra}", using=ALIAS)
    def func(a, /, b=2, *rest, c, **extra):
        return a

    assert func.lock_name(1, c=3) == "k:1:2:3:():{}"
    assert func.lock_name(1, 4, 5, c=3, a=6) == "k:1:4:3:(5,):{'a': 6}"
    assert func.lock_name(1, b=4, c=3) == "k:1:4:3:():{}"
    with pytest.raises(TypeError):
        func.lock_name(1)
    with pytest.raises(TypeError):
        func(1)


def test_key_callable_name_validated_at_call_time() -> None:
    @distlock(lambda order_id: f"order:{order_id}", using=ALIAS)
    def pay(order_id):
        return order_id

    with pytest.raises(InvalidLockName):
        pay("a\x00b")
    assert pay("a/b") == "a/b"


# -- item 12: on_lost, when the lock was lost while the function ran ------------------


def release_elsewhere(name: str) -> None:
    """Force-release ``name`` from another thread (its own connection), as an operator would."""
    assert in_thread(lambda: locks[ALIAS].force_release(name)) is True


def test_lost_raises_by_default_after_the_body_ran() -> None:
    ran = []

    @distlock("lost:{n}", using=ALIAS)
    def work(n):
        release_elsewhere(f"lost:{n}")
        ran.append(n)
        return n

    with pytest.raises(LockLost, match="lost:1"):
        work(1)
    assert ran == [1]
    assert not held_elsewhere("lost:1")


def test_lost_logged_and_result_returned(caplog) -> None:
    @distlock("lost:{n}", using=ALIAS, on_lost="log")
    def work(n):
        release_elsewhere(f"lost:{n}")
        return n * 10

    with caplog.at_level(logging.WARNING, logger="django_distlock"):
        assert work(2) == 20
    (record,) = [r for r in caplog.records if "on_lost" in r.getMessage()]
    assert record.name == "django_distlock" and record.levelno == logging.WARNING
    assert "'lost:2'" in record.getMessage() and repr(ALIAS) in record.getMessage()
    assert "work" in record.getMessage()
    assert (record.lock_name, record.lock_alias) == ("lost:2", ALIAS)
    assert isinstance(record.exc_info[1], LockLost)


def test_lost_callable_gets_exception_result_and_arguments() -> None:
    seen = []

    def on_lost(exc, result, *args, **kwargs):
        seen.append((type(exc), result, args, kwargs))
        return ("lost", result)

    @distlock("lost:{n}", using=ALIAS, on_lost=on_lost)
    def work(n, flag=False):
        release_elsewhere(f"lost:{n}")
        return n

    assert work(3, flag=True) == ("lost", 3)
    assert seen == [(LockLost, 3, (3,), {"flag": True})]


def test_not_lost_does_not_call_the_policy() -> None:
    @distlock("kept:{n}", using=ALIAS, on_lost=lambda *a, **k: pytest.fail("not lost"))
    def work(n):
        return n

    assert work(4) == 4


def test_body_error_wins_over_lost_and_skips_the_policy(caplog) -> None:
    @distlock("lost:{n}", using=ALIAS, on_lost=lambda *a, **k: pytest.fail("body raised"))
    def work(n):
        release_elsewhere(f"lost:{n}")
        raise KeyError("body")

    with pytest.raises(KeyError, match="body"):
        work(5)
    assert not held_elsewhere("lost:5")


@pytest.mark.parametrize("policy", ["raise", "log", "callable", "async callable"])
def test_lost_async_function(policy: str, caplog) -> None:
    ran = []

    async def async_policy(exc, result, n):
        await asyncio.sleep(0)
        return ("async", result)

    on_lost = {
        "callable": lambda exc, result, n: ("sync", result),
        "async callable": async_policy,
    }.get(policy, policy)

    @distlock("alost:{n}", using=ALIAS, on_lost=on_lost)
    async def work(n):
        await asyncio.to_thread(release_elsewhere, f"alost:{n}")
        ran.append(n)
        return n

    with caplog.at_level(logging.WARNING, logger="django_distlock"):
        if policy == "raise":
            with pytest.raises(LockLost):
                asyncio.run(work(1))
        else:
            result = asyncio.run(work(1))
            expected = {"log": 1, "callable": ("sync", 1), "async callable": ("async", 1)}
            assert result == expected[policy]
    assert ran == [1]
    logged = [r for r in caplog.records if "on_lost" in r.getMessage()]
    assert len(logged) == (policy == "log")
    assert not held_elsewhere("alost:1")


@pytest.mark.parametrize(("on_lost", "error"), [("ignore", ValueError), (42, TypeError)])
def test_bad_on_lost_refused_at_decoration(on_lost, error) -> None:
    with pytest.raises(error, match="on_lost must be 'raise', 'log' or a callable") as info:
        _decorate(on_lost=on_lost)
    assert "'order:{order_id}'" in str(info.value)


# Views run through the test client (urls: this module's urlpatterns).


def _buy(request, pk: int, view: str) -> HttpResponse:
    """The view's committed work, then an operator force-releases its lock."""
    User.objects.create(username=f"{view}-{pk}")
    release_elsewhere(f"{view}:{pk}")
    return HttpResponse(f"bought {pk}")


@distlock("buy-raise:{pk}", using=ALIAS)
def buy_raise(request, pk):
    return _buy(request, pk, "buy-raise")


@distlock("buy-log:{pk}", using=ALIAS, on_lost="log")
def buy_log(request, pk):
    return _buy(request, pk, "buy-log")


def _mark_unprotected(exc, response, request, pk):
    response["X-Lock-Lost"] = exc.__class__.__name__
    return response


@distlock("abuy:{pk}", using=ALIAS, on_lost=_mark_unprotected)
async def abuy(request, pk):
    await User.objects.acreate(username=f"abuy-{pk}")
    await asyncio.to_thread(release_elsewhere, f"abuy:{pk}")
    return HttpResponse(f"bought {pk}")


urlpatterns = [
    path("buy-raise/<int:pk>/", buy_raise),
    path("buy-log/<int:pk>/", buy_log),
    path("abuy/<int:pk>/", abuy),
]


@pytest.mark.urls(__name__)
def test_view_lost_raise_answers_500_after_its_work_committed() -> None:
    response = Client(raise_request_exception=False).post("/buy-raise/1/")
    assert response.status_code == 500
    assert User.objects.filter(username="buy-raise-1").exists()
    with pytest.raises(LockLost):
        Client().post("/buy-raise/2/")


@pytest.mark.urls(__name__)
def test_view_lost_log_answers_the_view_response(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="django_distlock"):
        response = Client().post("/buy-log/1/")
    assert (response.status_code, response.content) == (200, b"bought 1")
    assert User.objects.filter(username="buy-log-1").exists()
    assert any("'buy-log:1'" in r.getMessage() for r in caplog.records)
    assert not held_elsewhere("buy-log:1")


@pytest.mark.urls(__name__)
def test_async_view_lost_callable_through_the_client() -> None:
    response = asyncio.run(AsyncClient().post("/abuy/1/"))
    assert (response.status_code, response.content) == (200, b"bought 1")
    assert response["X-Lock-Lost"] == "LockLost"
    assert User.objects.filter(username="abuy-1").exists()
    response = Client().post("/abuy/2/")  # the sync client runs the async view too
    assert response["X-Lock-Lost"] == "LockLost"
