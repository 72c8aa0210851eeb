"""Enqueue-once Celery tasks (celery-once's ``QueueOnce`` model, on a ``DISTLOCK`` alias).

::

    @shared_task(base=QueueOnce, once={"key": "report:{account_id}", "ttl": 600})
    def build_report(account_id): ...

    build_report.delay(7)   # sent
    build_report.delay(7)   # AlreadyQueued while the first is queued or running

``apply_async()`` (so ``delay()``) takes the lock of the task's name and arguments
(or of ``once["key"]``, a ``@distlock`` template) without waiting, before the
message is sent; a miss raises :class:`~django_distlock.exceptions.AlreadyQueued`
(or, with ``once={"graceful": True}``, returns a result in state ``REJECTED``). The
grant's owner token travels in the message's headers to the worker that runs it;
that worker renews the lease when the task starts and releases it when the task
ends or fails (before its result is stored), a release checked against the token
on the server (a lock taken by a later enqueue after this lease ran out is never
freed by this task). A retry
(``self.retry()``) keeps it. The lease (``once["ttl"]``, an hour by default) bounds
how long a lost message keeps the name taken. docs/tasks.md says what it does not
promise.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from celery import Task, states
from celery.exceptions import Retry
from celery.result import EagerResult

from django_distlock.decorators import _template_function as template_function
from django_distlock.exceptions import AlreadyQueued, UnsupportedOperation
from django_distlock.handle import Lock, hold_of
from django_distlock.handler import DEFAULT_LOCK_ALIAS, locks
from django_distlock.values import validate_ttl

__all__ = ["HEADER", "ONCE_DEFAULTS", "QueueOnce"]

logger = logging.getLogger("django_distlock")

#: The message header carrying the enqueuer's grant to the worker.
HEADER = "distlock_once"
#: The ``once`` options and their defaults: the ``DISTLOCK`` alias, the lease in
#: seconds, the lock name template (None: the task's name and all its arguments), and
#: whether a refused enqueue returns a ``REJECTED`` result instead of raising.
ONCE_DEFAULTS: dict[str, Any] = {
    "using": DEFAULT_LOCK_ALIAS, "ttl": 3600.0, "key": None, "graceful": False,
}
_NO_EXC: tuple[None, None, None] = (None, None, None)


class QueueOnce(Task):
    """A Celery task base class (``base=QueueOnce``) that refuses to enqueue a task
    while an equal one is queued or running.

    Options come from the class attribute ``once`` (``@shared_task(base=QueueOnce,
    once={...})``), overridden per call by ``apply_async(..., once={...})``; see
    :data:`ONCE_DEFAULTS`.
    """

    #: This task's ``once`` options (merged over :data:`ONCE_DEFAULTS`).
    once: ClassVar[dict[str, Any]] = {}

    def once_options(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``once`` options of a call: the defaults, the task's, then ``overrides``.

        :param overrides: the call's ``once=`` dict.
        :returns: the merged options.
        :raises ValueError: for an unknown option or a bad ``ttl``.
        """
        options = {**ONCE_DEFAULTS, **self.once, **(overrides or {})}
        unknown = set(options) - set(ONCE_DEFAULTS)
        if unknown:
            raise ValueError(
                f"{self.name}: unknown once options {sorted(unknown)}; valid: "
                f"{sorted(ONCE_DEFAULTS)}."
            )
        options["ttl"] = validate_ttl(options["ttl"])
        return options

    def once_name(self, args: Any = None, kwargs: Any = None, key: str | None = None) -> str:
        """The lock name of a call: ``key`` rendered from its arguments, or
        ``"once:<task name>:<arguments as JSON>"``.

        :param args: the call's positional arguments.
        :param kwargs: the call's keyword arguments.
        :param key: a ``@distlock`` key template over the task's arguments.
        :returns: the name.
        :raises TypeError: for arguments the task does not take.
        """
        signature = inspect.signature(self.run)
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        if key is not None:
            return _render(key, signature, self.name)(args, kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        text = json.dumps(bound.arguments, sort_keys=True, default=repr, separators=(",", ":"))
        return f"once:{self.name}:{text}"

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send the task unless an equal one holds its lock (see the module's doc).

        :param args: the task's positional arguments.
        :param kwargs: the task's keyword arguments.
        :param options: Celery's ``apply_async`` options, and ``once``: this call's
            ``once`` options (:data:`ONCE_DEFAULTS`).
        :returns: Celery's ``AsyncResult``; with ``graceful``, an ``EagerResult`` in
            state ``REJECTED`` when refused.
        :raises AlreadyQueued: when refused (unless ``graceful``).
        :raises UnsupportedOperation: for an alias whose locks do not expire.
        :raises BackendUnavailable: when the lock server fails (nothing is sent).
        """
        once = self.once_options(options.pop("once", None))
        headers = dict(options.pop("headers", None) or {})
        if options.get("retries") or HEADER in headers:  # a retry: the lock travels on
            return super().apply_async(args, kwargs, headers=headers or None, **options)
        backend = locks[once["using"]]
        if not backend.supports_expiry:
            raise UnsupportedOperation(
                f"{self.name}: enqueue-once needs a lock that outlives the enqueuing "
                f"process, a lease; alias {once['using']!r} holds its locks only while its "
                "holder's session or transaction lasts. Use a Redis or database lease alias."
            )
        name = self.once_name(args, kwargs, once["key"])
        handle = backend.lock(name, ttl=once["ttl"], blocking=False)
        if not handle.acquire():
            if once["graceful"]:
                return EagerResult(None, None, states.REJECTED, name=self.name)
            raise AlreadyQueued(
                f"{self.name} is already queued or running with these arguments (lock "
                f"{name!r} on {backend.alias!r} is held).", name=name, alias=backend.alias,
            )
        acquisition = hold_of(handle).acquisition
        assert acquisition is not None
        headers[HEADER] = {
            "alias": backend.alias, "name": name, "token": acquisition.token,
            "ttl": once["ttl"],
        }
        try:
            result = super().apply_async(args, kwargs, headers=headers, **options)
        except BaseException:
            handle.release()  # nothing was sent
            raise
        _hand_off(handle)
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task with the enqueuer's grant: extend its lease to a full ``ttl`` as
        the run starts, release it as the run ends or fails (before the worker stores
        the result, so an enqueue after ``result.get()`` is accepted); a retry
        (``celery.exceptions.Retry``) keeps it, for the retried message carries it.

        :returns: the task's result.
        :raises: whatever the task raises.
        """
        grant = self._grant()
        if grant is None:  # sent without the grant: called directly, or an old message
            return super().__call__(*args, **kwargs)
        # The lease now counts from the start of the run (not on a retry: it did then).
        if not self.request.retries and _acquisition(grant).extend(float(grant["ttl"])) is None:
            logger.warning(
                "Enqueue-once lock %r of task %s[%s] ran out while the task was queued; "
                "an equal task may have been enqueued meanwhile.",
                grant["name"], self.name, self.request.id,
            )
        try:
            result = super().__call__(*args, **kwargs)
        except Retry:
            raise
        except BaseException:
            _release(grant)
            raise
        _release(grant)
        return result

    def _grant(self) -> dict[str, Any] | None:
        """The enqueuer's grant this run's message carries, if any."""
        request = self.request
        grant = getattr(request, HEADER, None) or (request.headers or {}).get(HEADER)
        return grant if isinstance(grant, dict) else None


def _release(grant: dict[str, Any]) -> None:
    """Release the enqueuer's grant; the server frees the lock only while this token
    holds it (a lease that ran out and was taken by a later enqueue stays taken)."""
    try:
        _acquisition(grant).release(_NO_EXC)
    except Exception:
        logger.warning("Releasing enqueue-once lock %r failed (it ends with its lease)",
                       grant["name"], exc_info=True)


def _render(key: str, signature: inspect.Signature, task: str) -> Callable[..., str]:
    render = template_function(key, signature, f"once key {key!r} of task {task}")
    return lambda args, kwargs: str(render(args, kwargs))


def _acquisition(grant: dict[str, Any]) -> Any:
    """The backend's acquisition of the enqueuer's grant (its token), on a fresh handle:
    what the worker extends and releases."""
    backend = locks[grant["alias"]]
    handle = backend.lock(grant["name"], ttl=float(grant["ttl"]), blocking=False)
    return backend.acquisition(hold_of(handle), grant["token"], False, None)


def _hand_off(handle: Lock) -> None:
    """The enqueuer lets its grant go without releasing it (the worker will). On a
    PostgreSQL lease the granting session also holds the grant's generation lock
    (what wakes a waiter in the server at the release): have the session give it back
    before its next statement, as it does for a lease released through another one."""
    acquisition = hold_of(handle).acquisition
    session = getattr(acquisition, "granted_on", None)
    generation = getattr(acquisition, "generation", None)
    if acquisition is not None and session is not None and generation is not None:
        session.orphans.append((handle.key, generation))
