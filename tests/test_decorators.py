"""The ``distlock`` decorator and ``lock()``: key templates, policies, sync and async."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from django.test import RequestFactory

from django_distlock import distlock, lock, locks
from django_distlock.exceptions import InvalidLockAlias, LockNotAcquired, LockTimeout
from django_distlock.http import conflict_response, locked_response

from .conftest import in_thread

pytestmark = pytest.mark.django_db(transaction=True)
ALIAS = "sqlite-lease"


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


def test_bad_arguments_refused() -> None:
    with pytest.raises(ValueError):
        distlock("x", on_fail="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        distlock(42)  # type: ignore[arg-type]


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
