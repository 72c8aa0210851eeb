"""``distlock`` decorator and ``lock()`` context manager, for sync and async code."""

from __future__ import annotations

import functools
import inspect
import logging
import re
import string
import sys
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from .context import describer, enter, leave
from .exceptions import BackendUnavailable, DistLockError, LockLost, LockNotAcquired
from .handle import Lock
from .handler import DEFAULT_LOCK_ALIAS, locks
from .kinds import Kind
from .multilock import MultiLock
from .names import validate_name
from .renewal import validate_max_hold
from .values import DEFAULT, _Default, validate_timeout, validate_ttl

logger = logging.getLogger("django_distlock")

F = TypeVar("F", bound=Callable[..., Any])
OnFail = Literal["raise", "skip"] | Callable[..., Any]
OnLost = Literal["raise", "log"] | Callable[..., Any]
#: ``(args, kwargs) -> name``: renders one call's lock name (a list: a multi-lock's names).
_Render = Callable[[tuple[Any, ...], dict[str, Any]], "str | list[str]"]
#: ``bound arguments -> str``: renders one field of a template.
_Field = Callable[[dict[str, Any]], str]


def lock(
    name: str,
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | _Default = DEFAULT,
    timeout: float | _Default | None = DEFAULT,
    blocking: bool = True,
    reentrant: bool | _Default = DEFAULT,
    auto_renew: bool | _Default = DEFAULT,
    max_hold: float | None = None,
    order_class: str | None = None,
) -> Lock:
    """Return a handle on ``name`` of alias ``using``, for ``with`` or ``async with``.

    ``with lock("order:42", ttl=30, timeout=5) as h:`` acquires or raises
    :class:`~django_distlock.exceptions.LockTimeout` (or
    :class:`~django_distlock.exceptions.LockNotAcquired` when not blocking),
    and releases on exit. ``reentrant``, ``auto_renew`` and ``max_hold`` are
    :meth:`~django_distlock.backends.base.BaseLockBackend.lock`'s: a reentrant
    block nested in another of the same name (in the same thread or task) enters at
    once; the lease is renewed while the block runs, and the exit raises
    :class:`~django_distlock.exceptions.LockLost` if a renewal found it gone.
    ``order_class`` names the lock's class for the lock-order checker (``ordering.py``).

    :raises InvalidLockAlias: for an unknown alias.
    :raises InvalidLockName: for a bad name.
    :raises UnsupportedOperation: for ``auto_renew=True`` on locks that do not expire.
    """
    return locks[using].lock(
        name, ttl=ttl, timeout=timeout, blocking=blocking, reentrant=reentrant,
        auto_renew=auto_renew, max_hold=max_hold, order_class=order_class,
    )


def distlock(
    key: str | list[str] | tuple[str, ...] | Callable[..., str | list[str]],
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    ttl: float | _Default = DEFAULT,
    timeout: float | _Default | None = DEFAULT,
    blocking: bool = True,
    on_fail: OnFail = "raise",
    on_unavailable: OnFail = "raise",
    skip_value: Any = None,
    on_lost: OnLost = "raise",
    reentrant: bool | _Default = DEFAULT,
    auto_renew: bool | _Default = DEFAULT,
    max_hold: float | None = None,
    kind: str = "exclusive",
    limit: int | None = None,
) -> Callable[[F], F]:
    """Run the decorated function (sync or async) while holding a lock.

    The wrapper's ``lock_name(*args, **kwargs)`` returns the name a call with
    those arguments locks (to share the lock with a ``lock()`` block).

    :param key: a ``str.format`` template filled from the call's bound
        arguments (``"stock:{product_id}"``, ``"user:{request.user.pk}"``),
        with some fixed text; each value is formatted as ``str.format`` does
        (``str()`` for ordinary values), then its control characters, lone
        surrogates and backslashes are escaped (``\\x00``, ``\\ud800``,
        ``\\\\``), so any argument gives an accepted name and distinct values
        distinct names. Or a callable taking the call's arguments and returning
        the name as it is (checked at call time: a bad one raises
        :class:`~django_distlock.exceptions.InvalidLockName`). A list of templates
        (or a callable returning a list of names) takes the exclusive locks of all
        those names or none, through
        :meth:`~django_distlock.backends.base.BaseLockBackend.multi_lock` (a fixed
        order, so two calls over overlapping names never deadlock).
    :param using: the ``DISTLOCK`` alias, looked up at each call (so
        ``override_settings`` applies); an unknown one raises
        :class:`~django_distlock.exceptions.InvalidLockAlias` at call time.
    :param ttl: lease length in seconds (default: the alias' ``TTL``).
    :param timeout: seconds to wait, None for ever (default: the alias' ``TIMEOUT``).
    :param blocking: whether to wait at all.
    :param on_fail: when the lock is not had: ``"raise"`` re-raises
        :class:`~django_distlock.exceptions.LockNotAcquired`/``LockTimeout``;
        ``"skip"`` returns ``skip_value`` without calling the function; a
        callable is called as ``on_fail(exc, *args, **kwargs)`` and its result
        returned (see :mod:`django_distlock.http` for view responses).
    :param on_unavailable: when the lock server fails while acquiring
        (:class:`~django_distlock.exceptions.BackendUnavailable`, also at once while
        the alias' ``FAIL_FAST`` circuit is open): the same choices as ``on_fail``
        (``http.unavailable_response`` answers 503).
    :param on_lost: when the lock turns out lost (expired, force-released)
        as the function returns, its work already done: ``"raise"`` raises
        :class:`~django_distlock.exceptions.LockLost` (a view answers 500);
        ``"log"`` logs a warning on the ``django_distlock`` logger and returns
        the function's result; a callable is called as
        ``on_lost(exc, result, *args, **kwargs)`` and its result returned.
        Not consulted when the function raised (its exception propagates).
        See ``docs/decorator.md`` for the trade-off.
    :param reentrant: a call made while the same thread or task holds the name
        through a reentrant handle (a locked function calling another that locks the
        same name) enters at once, counted, with no server call; the lock is free
        after the outermost call returns. Default: the alias' ``REENTRANT``; without
        it such a nested call raises
        :class:`~django_distlock.exceptions.SelfDeadlock`.
    :param auto_renew: renew the lease every third of ``ttl`` while the function
        runs (default: the alias' ``AUTO_RENEW``); a renewal that finds the lease
        gone makes the call end as ``on_lost`` says. On an alias whose locks do
        not expire, calls raise
        :class:`~django_distlock.exceptions.UnsupportedOperation`.
    :param max_hold: with ``auto_renew``, stop renewing this many seconds after
        the grant (see ``docs/renewal.md``).
    :param kind: ``"exclusive"`` (``lock()``), ``"read"`` or ``"write"``
        (``read_lock()``/``write_lock()``), or ``"semaphore"`` (one of ``limit``
        leases, ``semaphore()``); an alias without it raises
        :class:`~django_distlock.exceptions.UnsupportedOperation` at call time.
    :param limit: the semaphore's number of leases (``kind="semaphore"`` only).
    :raises TypeError, ValueError: when decorating, for a bad option or a
        malformed template, or one naming an argument the function does not
        have; the message names the template and the function. TypeError for a
        Celery task object: ``@distlock`` goes below ``@shared_task``.
    """

    def decorator(func: F) -> F:
        _refuse_task_object(func, key)  # first: _describe() would evaluate a task proxy
        where = _describe(key, func)
        _check_options(where, using, ttl, timeout, blocking, on_fail)
        _check_renewal(where, auto_renew, max_hold)
        lock_kind = _check_kind(where, kind, limit)
        if not isinstance(reentrant, bool | _Default):
            raise TypeError(f"{where}: reentrant must be True or False, not {reentrant!r}.")
        if reentrant is True and not lock_kind.reentrant_ok:
            raise ValueError(f"{where}: {lock_kind.family} are not reentrant.")
        if isinstance(key, list | tuple) and lock_kind is not Kind.EXCLUSIVE:
            raise ValueError(f"{where}: a list of names takes exclusive locks only (kind).")
        _check_policy(where, "on_lost", on_lost, ("raise", "log"))
        _check_policy(where, "on_unavailable", on_unavailable, ("raise", "skip"))
        name_of = _key_function(key, func, where)
        # The lock-order checker's class of the locks: the template (one str key).
        order = {"order_class": key} if isinstance(key, str) else {}
        describe = describer(func)
        raise_lost = on_lost == "raise"
        call_lost = None if isinstance(on_lost, str) else on_lost

        def failed(exc: DistLockError, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            policy = on_fail if isinstance(exc, LockNotAcquired) else on_unavailable
            if policy == "raise":
                raise exc
            if policy == "skip":
                return skip_value
            return cast(Callable[..., Any], policy)(exc, *args, **kwargs)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                held = _handle(
                    using, lock_kind, limit, name_of(args, kwargs), ttl=ttl, timeout=timeout,
                    blocking=blocking, reentrant=reentrant, auto_renew=auto_renew,
                    max_hold=max_hold, **order,
                )
                context = enter(describe(args))
                try:
                    await held.__aenter__()
                except (LockNotAcquired, BackendUnavailable) as exc:
                    result = failed(exc, args, kwargs)
                    return await result if inspect.isawaitable(result) else result
                finally:
                    leave(context)
                try:
                    result = await func(*args, **kwargs)
                except BaseException as exc:
                    await held.__aexit__(type(exc), exc, exc.__traceback__)
                    raise
                try:
                    await held.__aexit__(None, None, None)
                except LockLost as exc:
                    if raise_lost:
                        raise
                    if call_lost is None:
                        _log_lost(exc, held, where)
                        return result
                    outcome = call_lost(exc, result, *args, **kwargs)
                    return await outcome if inspect.isawaitable(outcome) else outcome
                return result

            wrapper: Callable[..., Any] = async_wrapper
        else:

            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                held = _handle(
                    using, lock_kind, limit, name_of(args, kwargs), ttl=ttl, timeout=timeout,
                    blocking=blocking, reentrant=reentrant, auto_renew=auto_renew,
                    max_hold=max_hold, **order,
                )
                context = enter(describe(args))
                try:
                    held.__enter__()
                except (LockNotAcquired, BackendUnavailable) as exc:
                    return failed(exc, args, kwargs)
                finally:
                    leave(context)
                try:
                    result = func(*args, **kwargs)
                except BaseException as exc:
                    held.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                try:
                    held.__exit__(None, None, None)
                except LockLost as exc:
                    if raise_lost:
                        raise
                    if call_lost is None:
                        _log_lost(exc, held, where)
                        return result
                    return call_lost(exc, result, *args, **kwargs)
                return result

            wrapper = sync_wrapper

        wrapper.lock_name = lambda *args, **kwargs: name_of(args, kwargs)  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorator


def _log_lost(exc: LockLost, held: Lock | MultiLock, where: str) -> None:
    """The ``on_lost="log"`` policy's warning."""
    alias = held.backend.alias
    name = held.name if isinstance(held, Lock) else ", ".join(h.name for h in held.handles)
    logger.warning(
        "Lock %r on %r was lost before %s returned: part of its run was not protected; "
        "returning its result (on_lost='log').",
        name,
        alias,
        where,
        exc_info=exc,
        extra={"lock_name": name, "lock_alias": alias},
    )


# -- checks made when decorating ------------------------------------------------


def _refuse_task_object(func: object, key: object) -> None:
    """Raise TypeError when ``func`` is a Celery task (or the proxy ``shared_task``
    returns) rather than a function: ``@distlock`` above ``@shared_task`` would wrap
    the task object, so the lock would be taken by whoever *calls* it (``.delay()``
    returns at once, in the caller's process) and never by the worker that runs it.

    :param func: what ``@distlock`` is applied to.
    :param key: the decorator's key, for the message.
    :raises TypeError: for a Celery task object or proxy.
    """
    celery = sys.modules.get("celery")
    if celery is None:  # no Celery imported: no task object can exist
        return
    from celery.app.task import Task
    from celery.local import Proxy

    # type(), not isinstance(): a Proxy answers isinstance() by evaluating itself,
    # which would finalize the Celery app while modules are still being imported.
    if issubclass(type(func), Task | Proxy):
        raise TypeError(
            f"@distlock({key!r}) is applied to a Celery task object "
            f"({type(func).__name__}). Put it below the "
            "task decorator, on the function, so the lock is taken in the worker that "
            "runs the task:\n\n    @shared_task(bind=True)\n    @distlock(...)\n"
            "    def task(self, ...): ...\n\n(see docs/tasks.md)."
        )


def _describe(key: object, func: Callable[..., Any]) -> str:
    """Name the decoration in error messages: ``@distlock('order:{id}') on app.views.pay``."""
    shown = repr(key) if isinstance(key, str) or not callable(key) else _qualname(key)
    return f"@distlock({shown}) on {func.__module__}.{_qualname(func)}"


def _qualname(obj: object) -> str:
    return getattr(obj, "__qualname__", None) or repr(obj)


def _check_options(
    where: str, using: object, ttl: object, timeout: object, blocking: object, on_fail: object
) -> None:
    """Raise TypeError/ValueError, prefixed with ``where``, for an unusable option."""
    try:
        if not isinstance(ttl, _Default):
            validate_ttl(ttl)
        if not isinstance(timeout, _Default):
            validate_timeout(timeout)
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    if not isinstance(blocking, bool):
        raise TypeError(f"{where}: blocking must be True or False, not {blocking!r}.")
    if not isinstance(using, str):
        raise TypeError(
            f"{where}: using must be the str alias of a DISTLOCK entry, not {type(using).__name__}."
        )
    _check_policy(where, "on_fail", on_fail, ("raise", "skip"))


def _check_kind(where: str, kind: object, limit: object) -> Kind:
    checked = Kind.parse(kind, where)
    if checked.takes_limit != (limit is not None):
        raise ValueError(f"{where}: limit= goes with kind='semaphore', and only with it.")
    return checked


def _handle(
    using: str, kind: Kind, limit: int | None, name: str | list[str], **options: Any
) -> Lock | MultiLock:
    """The handle of one call: the alias' lock of that kind, or the multi-lock of a list
    of names."""
    backend = locks[using]
    if isinstance(name, list | tuple):
        if kind is not Kind.EXCLUSIVE:
            raise ValueError("A list of lock names takes exclusive locks only (kind).")
        return backend.multi_lock(name, **options)
    return backend.lock_of_kind(kind, name, limit, **options)


def _check_renewal(where: str, auto_renew: object, max_hold: object) -> None:
    """Raise TypeError/ValueError, prefixed with ``where``, for unusable renewal options."""
    if not isinstance(auto_renew, bool | _Default):
        raise TypeError(f"{where}: auto_renew must be True or False, not {auto_renew!r}.")
    try:
        validate_max_hold(max_hold)
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    if max_hold is not None and auto_renew is False:
        raise ValueError(
            f"{where}: max_hold caps the renewals of auto_renew: pass auto_renew=True."
        )


def _check_policy(where: str, option: str, policy: object, names: tuple[str, ...]) -> None:
    if (isinstance(policy, str) and policy in names) or callable(policy):
        return
    choices = ", ".join(repr(name) for name in names)
    error = ValueError if isinstance(policy, str) else TypeError
    raise error(f"{where}: {option} must be {choices} or a callable, not {policy!r}.")


# -- lock names -------------------------------------------------------------------


def _key_function(key: object, func: Callable[..., Any], where: str) -> _Render:
    """Return ``(args, kwargs) -> lock name`` for a template or a callable, or
    ``-> list of names`` for a list of templates."""
    if isinstance(key, str):
        return _template_function(key, inspect.signature(func), where)
    if isinstance(key, list | tuple):
        if not key or not all(isinstance(template, str) for template in key):
            raise TypeError(f"{where}: a list of keys must hold one str template or more.")
        signature = inspect.signature(func)
        renders = [_template_function(template, signature, where) for template in key]
        return lambda args, kwargs: [cast(str, render(args, kwargs)) for render in renders]
    if callable(key):
        key_callable = key
        return lambda args, kwargs: key_callable(*args, **kwargs)
    raise TypeError(
        f"{where}: key must be a str template, a list of them, or a callable returning the "
        f"lock name, not {type(key).__name__}."
    )


def _template_function(template: str, signature: inspect.Signature, where: str) -> _Render:
    """Compile ``template`` once into a function of the call's arguments."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"{where}: the lock key template is malformed: {exc}.") from exc
    fields: list[tuple[str, _Field]] = []
    text = ""
    fixed = ""
    for literal, field, spec, conversion in parsed:
        text += literal
        fixed += literal
        if field is not None:
            fields.append((text, _field_function(field, spec, conversion, signature, where)))
            text = ""
    if not fixed:
        raise ValueError(
            f"{where}: the lock key template needs some fixed text, like 'order:{{order_id}}' "
            "(an empty value would make an empty name, and the text keeps the locks of "
            "different functions apart)."
        )
    try:
        validate_name(fixed)
    except ValueError as exc:
        raise ValueError(f"{where}: the lock key template's fixed text: {exc}") from exc
    tail = text

    def render(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        return "".join([literal + value_of(arguments) for literal, value_of in fields]) + tail

    return render


def _field_function(
    field: str,
    spec: str | None,
    conversion: str | None,
    signature: inspect.Signature,
    where: str,
) -> _Field:
    """Return ``bound arguments -> the field's escaped text``."""
    try:
        head, path = _split_field(field)
    except ValueError as exc:
        raise ValueError(f"{where}: the lock key template is malformed: {exc}.") from exc
    if not head or head.isdigit():
        raise ValueError(
            f"{where}: the lock key template must name arguments ({{order_id}}), not positions."
        )
    if head not in signature.parameters:
        raise ValueError(
            f"{where}: the lock key template names {head!r}, which the function "
            f"{signature} does not take."
        )
    if conversion not in (None, "r", "s", "a"):
        raise ValueError(
            f"{where}: the lock key template is malformed: unknown conversion "
            f"!{conversion} (use !r, !s or !a)."
        )
    spec = spec or ""
    if "{" in spec:
        raise ValueError(
            f"{where}: the lock key template is malformed: a field inside a format spec "
            f"({{{field}:{spec}}}) is not supported."
        )
    if not path and conversion is None:
        return lambda arguments: _escape(format(arguments[head], spec))
    convert = {None: None, "r": repr, "s": str, "a": ascii}[conversion]

    def value_of(arguments: dict[str, Any]) -> str:
        value = arguments[head]
        for is_attribute, name in path:
            value = getattr(value, name) if is_attribute else value[name]
        if convert is not None:
            value = convert(value)
        return _escape(format(value, spec))

    return value_of


#: One ``.attribute`` or ``[index]`` of a field name (``str.format``'s grammar).
_FIELD_PART = re.compile(r"\.([^.\[]+)|\[([^\]]+)\]")


def _split_field(field: str) -> tuple[str, list[tuple[bool, Any]]]:
    """Split ``"order.items[0]"`` into ``"order"`` and ``[(True, "items"), (False, 0)]``,
    as ``str.format`` reads a field name (digit-only indexes are ints)."""
    head = re.match(r"[^.\[]*", field).group()  # type: ignore[union-attr]
    path: list[tuple[bool, Any]] = []
    position = len(head)
    for part in _FIELD_PART.finditer(field, position):
        if part.start() != position:
            break
        attribute, index = part.groups()
        path.append((True, attribute) if attribute else (False, int(index) if index.isdigit()
                                                         else index))
        position = part.end()
    if position != len(field):
        rest = field[position:]
        what = "Empty attribute" if rest.startswith(".") else "Malformed index"
        raise ValueError(f"{what} in field name {field!r}")
    return head, path


#: What an argument's text may not carry into a name: the backslash (the escape
#: character itself, so escaping stays one-to-one), control characters and lone
#: surrogates (refused by :func:`~django_distlock.names.validate_name`).
_UNSAFE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(text: str) -> str:
    """Escape ``text`` one-to-one into text :func:`validate_name` accepts."""
    if "\\" not in text and text.isprintable():
        return text  # the usual case, checked at C speed
    return _UNSAFE.sub(_escape_character, text)


def _escape_character(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
