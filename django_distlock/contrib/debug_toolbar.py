"""A django-debug-toolbar panel: the locks taken while a request was served, as the SQL
panel shows its queries.

::

    DEBUG_TOOLBAR_PANELS = [
        *debug_toolbar.settings.PANELS_DEFAULTS,
        "django_distlock.contrib.debug_toolbar.LocksPanel",
    ]

Each lock the request's code asked for is a row: its name, alias, kind, the outcome
(acquired, timeout, busy, or the error the acquire raised), the wait and the hold (ms),
the fencing token, whether it was lost; below the table, the lock-order checker's
findings made during the request (``ordering.py``). Recorded from the library's signals,
only those sent in the request's own context (its thread, or its task under ASGI:
another request served at the same time is not mixed in). Nothing of it runs unless the
toolbar is on for the request.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token
from typing import Any

from debug_toolbar.panels import Panel
from django.template import Context, Template

from django_distlock import ordering, signals

__all__ = ["LocksPanel"]

_UID = "django_distlock.contrib.debug_toolbar"
#: The panel recording in this context (the request's), if any.
_current: ContextVar[LocksPanel | None] = ContextVar("django_distlock_locks_panel",
                                                     default=None)

_TEMPLATE = Template("""{% load i18n %}
{% if locks %}
<table>
  <thead><tr>
    <th>Name</th><th>Alias</th><th>Kind</th><th>Outcome</th>
    <th>Wait (ms)</th><th>Hold (ms)</th><th>Fencing token</th><th>Lost</th>
  </tr></thead>
  <tbody>
  {% for lock in locks %}
    <tr class="{% cycle 'djDebugOdd' 'djDebugEven' %}">
      <td class="djdt-distlock-name">{{ lock.name }}</td><td>{{ lock.alias }}</td>
      <td>{{ lock.kind }}</td><td>{{ lock.outcome }}</td>
      <td>{{ lock.wait_ms|floatformat:2 }}</td>
      <td>{% if lock.outcome != "acquired" %}&mdash;{% elif lock.hold_ms is None %}held
          {% else %}{{ lock.hold_ms|floatformat:2 }}{% endif %}</td>
      <td>{{ lock.token|default_if_none:"" }}</td><td>{% if lock.lost %}lost{% endif %}</td>
    </tr>
  {% endfor %}
  </tbody>
</table>
{% else %}
<p>No lock was asked for while this request was served.</p>
{% endif %}
{% for warning in order_warnings %}<p class="djdt-distlock-order">{{ warning }}</p>{% endfor %}
""")


class LocksPanel(Panel):
    """The panel (see the module)."""

    title = "Locks"
    #: The signals are sent in the request's context under ASGI too.
    is_async = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rows: list[dict[str, Any]] = []
        self._open: dict[int, tuple[dict[str, Any], float]] = {}
        self._token: Token[LocksPanel | None] | None = None
        self._violations = 0

    @property
    def nav_subtitle(self) -> str:
        locks = self.get_stats().get("locks", [])
        waited = sum(lock["wait_ms"] for lock in locks)
        return f"{len(locks)} lock{'s' * (len(locks) != 1)} in {waited:.2f} ms of waiting"

    @property
    def content(self) -> str:
        """The table, rendered from the recorded stats (no template to install)."""
        return _TEMPLATE.render(Context(self.get_stats()))

    def enable_instrumentation(self) -> None:
        self._token = _current.set(self)
        self._violations = len(ordering.violations())
        for signal, receiver in self._receivers():
            signal.connect(receiver, weak=False, dispatch_uid=self._uid(receiver))

    def disable_instrumentation(self) -> None:
        for signal, receiver in self._receivers():
            signal.disconnect(dispatch_uid=self._uid(receiver))
        token, self._token = self._token, None
        if token is not None:
            try:
                _current.reset(token)
            except ValueError:  # disabled from another context than it was enabled in
                _current.set(None)

    def generate_stats(self, request: Any, response: Any) -> None:
        self.record_stats({
            "locks": self._rows,
            "order_warnings": ordering.violations()[self._violations:],
        })

    def _uid(self, receiver: Any) -> str:
        return f"{_UID}.{id(self)}.{receiver.__name__}"

    def _receivers(self) -> list[tuple[Any, Any]]:
        return [
            (signals.lock_acquired, self._acquired),
            (signals.lock_not_acquired, self._not_acquired),
            (signals.lock_acquire_failed, self._acquire_failed),
            (signals.lock_released, self._released),
            (signals.lock_lost, self._lost),
        ]

    # -- the receivers (in the thread or task that sent the signal) -------------------

    def _row(self, handle: Any, kwargs: dict[str, Any], outcome: str, waited: float
             ) -> dict[str, Any]:
        row = {
            "name": kwargs.get("name", ""), "alias": kwargs.get("alias", ""),
            "kind": str(getattr(handle.kind, "value", handle.kind)), "outcome": outcome,
            "wait_ms": waited * 1000, "hold_ms": None, "token": kwargs.get("fencing_token"),
            "lost": False,
        }
        self._rows.append(row)
        return row

    def _acquired(self, sender: Any, handle: Any = None, waited: float = 0.0,
                  **kwargs: Any) -> None:
        if handle is None or _current.get() is not self:
            return
        row = self._row(handle, kwargs, "acquired", waited)
        self._open.setdefault(id(handle), (row, time.perf_counter()))

    def _not_acquired(self, sender: Any, handle: Any = None, waited: float = 0.0,
                      **kwargs: Any) -> None:
        if handle is None or _current.get() is not self:
            return
        self._row(handle, kwargs, "timeout" if handle.options.blocking else "busy", waited)

    def _acquire_failed(self, sender: Any, handle: Any = None, waited: float = 0.0,
                        error: BaseException | None = None, **kwargs: Any) -> None:
        if handle is None or _current.get() is not self:
            return
        self._row(handle, kwargs, f"error: {type(error).__name__}", waited)

    def _released(self, sender: Any, handle: Any = None, **kwargs: Any) -> None:
        if handle is None or _current.get() is not self:
            return
        held = self._open.pop(id(handle), None)
        if held is not None:
            held[0]["hold_ms"] = (time.perf_counter() - held[1]) * 1000

    def _lost(self, sender: Any, handle: Any = None, **kwargs: Any) -> None:
        held = self._open.get(id(handle)) if handle is not None else None
        if held is not None:  # told in any thread (the watchdog's): still this request's
            held[0]["lost"] = True
