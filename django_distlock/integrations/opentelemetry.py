"""OpenTelemetry traces and metrics of lock operations: :class:`DistlockInstrumentor`.

::

    from django_distlock.integrations.opentelemetry import DistlockInstrumentor

    DistlockInstrumentor().instrument()          # the global providers, or:
    DistlockInstrumentor().instrument(tracer_provider=tp, meter_provider=mp)

or, with ``opentelemetry-instrument`` (the entry point ``distlock`` of the group
``opentelemetry_instrumentor``), nothing in code. What it makes (docs/observability.md):

- a span ``distlock.acquire`` per ``acquire()`` (granted, or not: a timeout, a busy
  name, an error), a child of the span current in the acquiring thread or task, from
  the call's start to its end, with ``distlock.name``, ``distlock.alias``,
  ``distlock.backend``, ``distlock.kind``, ``distlock.outcome`` (``acquired``,
  ``timeout``, ``busy``, ``error``) and ``distlock.wait`` (seconds); an ``error`` span
  records the exception ``acquire()`` raised (``BackendUnavailable``, ``Deadlock``:
  the signal ``lock_acquire_failed``) and its ``error.type``;
- a span ``distlock.hold`` from each grant to its release (``distlock.fencing_token``,
  ``distlock.lost``), with an event ``distlock.renewed`` per renewal and
  ``distlock.lost`` when the lock was lost (the span then ends, with an error status);
- metrics: histograms ``distlock.wait.duration`` and ``distlock.hold.duration`` (s),
  counters ``distlock.lost`` and ``distlock.timeouts``, with the attributes
  ``distlock.alias``, ``distlock.kind`` (and ``distlock.outcome`` on the wait): never
  the lock's name, so their cardinality is the site's aliases and kinds.

They are made from the library's signals (``signals.py``), which the lock handle sends
only to receivers there are: uninstrumented, nothing of OpenTelemetry is imported and
the hot path makes no call more (the ``benchmarks.hops`` budget is unchanged). An
``acquire()`` refused before it starts (bad arguments, ``SelfDeadlock``,
``LockOrderViolation``) makes no span.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Collection
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from opentelemetry.trace import Span, Status, StatusCode

from .. import __version__, signals

__all__ = ["DistlockInstrumentor"]

_SCOPE = "django_distlock"
#: The receivers' ``dispatch_uid`` prefix: connected once, whatever instrument() does.
_UID = "django_distlock.integrations.opentelemetry"


class DistlockInstrumentor(BaseInstrumentor):
    """Traces and metrics of every lock operation of the process (see the module).

    ``instrument(tracer_provider=None, meter_provider=None)`` connects it (the global
    providers when None); ``uninstrument()`` disconnects it and ends the hold spans
    still open. ``BaseInstrumentor`` makes it a singleton: instrumenting twice warns and
    does nothing.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        """What must be installed for :meth:`instrument` (checked by the base class)."""
        return ("django >= 5.2",)

    def _instrument(self, **kwargs: Any) -> None:
        tracer = trace.get_tracer(_SCOPE, __version__, kwargs.get("tracer_provider"))
        meter = metrics.get_meter(_SCOPE, __version__, kwargs.get("meter_provider"))
        self._receivers: _Receivers | None = _Receivers(tracer, meter)
        self._receivers.connect()

    def _uninstrument(self, **kwargs: Any) -> None:
        receivers: _Receivers | None = getattr(self, "_receivers", None)
        if receivers is not None:
            receivers.disconnect()
            self._receivers = None


class _Receivers:
    """The signal receivers of one instrumentation, and the hold spans it has open."""

    def __init__(self, tracer: trace.Tracer, meter: metrics.Meter) -> None:
        self.tracer = tracer
        self.wait = meter.create_histogram(
            "distlock.wait.duration", unit="s",
            description="Seconds an acquire() waited, granted or not.",
        )
        self.hold = meter.create_histogram(
            "distlock.hold.duration", unit="s",
            description="Seconds from a grant to its release (or its loss).",
        )
        self.lost = meter.create_counter(
            "distlock.lost", description="Held locks their holder learned were gone.",
        )
        self.timeouts = meter.create_counter(
            "distlock.timeouts", description="Blocking acquires that ran out of time.",
        )
        #: Each handle's open hold span, its grant's time (perf_counter), and how many
        #: acquisitions of a reentrant handle it covers.
        self.holds: weakref.WeakKeyDictionary[Any, tuple[Span, float, int]] = (
            weakref.WeakKeyDictionary()
        )

    def connect(self) -> None:
        for signal, receiver in self._pairs():
            signal.connect(receiver, dispatch_uid=f"{_UID}.{receiver.__name__}", weak=False)

    def disconnect(self) -> None:
        for signal, receiver in self._pairs():
            signal.disconnect(dispatch_uid=f"{_UID}.{receiver.__name__}")
        for span, _, _ in list(self.holds.values()):
            span.end()
        self.holds.clear()

    def _pairs(self) -> list[tuple[Any, Any]]:
        return [
            (signals.lock_acquired, self.acquired),
            (signals.lock_not_acquired, self.not_acquired),
            (signals.lock_acquire_failed, self.acquire_failed),
            (signals.lock_released, self.released),
            (signals.lock_lost, self.lost_lock),
            (signals.lock_renewed, self.renewed),
        ]

    # -- the receivers -----------------------------------------------------------

    def acquired(self, sender: Any, handle: Any = None, waited: float = 0.0,
                 **kwargs: Any) -> None:
        if handle is None:
            return
        attributes = _attributes(handle, kwargs)
        self._acquire_span(attributes, waited, "acquired")
        held = self.holds.get(handle)
        if held is not None:  # a reentrant handle acquired again: the hold goes on
            self.holds[handle] = (held[0], held[1], held[2] + 1)
            return
        token = kwargs.get("fencing_token")
        span = self.tracer.start_span("distlock.hold", attributes={
            **attributes, "distlock.lost": False,
            **({"distlock.fencing_token": token} if token is not None else {}),
        })
        self.holds[handle] = (span, time.perf_counter(), 1)

    def not_acquired(self, sender: Any, handle: Any = None, waited: float = 0.0,
                     **kwargs: Any) -> None:
        if handle is None:
            return
        attributes = _attributes(handle, kwargs)
        outcome = "timeout" if handle.options.blocking else "busy"
        self._acquire_span(attributes, waited, outcome)
        if outcome == "timeout":
            self.timeouts.add(1, _metric(attributes))

    def acquire_failed(self, sender: Any, handle: Any = None, waited: float = 0.0,
                       error: BaseException | None = None, **kwargs: Any) -> None:
        if handle is None:
            return
        self._acquire_span(_attributes(handle, kwargs), waited, "error", error)

    def released(self, sender: Any, handle: Any = None, **kwargs: Any) -> None:
        held = self.holds.pop(handle, None) if handle is not None else None
        if held is None:
            return
        span, since, depth = held
        if depth > 1:  # an inner release of a reentrant handle
            self.holds[handle] = (span, since, depth - 1)
            return
        self.hold.record(time.perf_counter() - since, _metric(_attributes(handle, kwargs)))
        span.end()

    def lost_lock(self, sender: Any, handle: Any = None, **kwargs: Any) -> None:
        attributes = _attributes(handle, kwargs) if handle is not None else {
            "distlock.alias": kwargs.get("alias", ""), "distlock.kind": "exclusive"}
        self.lost.add(1, _metric(attributes))
        held = self.holds.pop(handle, None) if handle is not None else None
        if held is None:
            return
        span, since, _ = held
        span.add_event("distlock.lost")
        span.set_attribute("distlock.lost", True)
        span.set_status(Status(StatusCode.ERROR, "the lock was lost while held"))
        self.hold.record(time.perf_counter() - since, _metric(attributes))
        span.end()

    def renewed(self, sender: Any, handle: Any = None, **kwargs: Any) -> None:
        held = self.holds.get(handle) if handle is not None else None
        if held is not None:
            expires = getattr(handle, "expires_at", None)
            held[0].add_event("distlock.renewed", {
                "distlock.expires_at": expires.isoformat() if expires else ""})

    def _acquire_span(self, attributes: dict[str, Any], waited: float, outcome: str,
                      error: BaseException | None = None) -> None:
        """A span from the acquire's start (``waited`` ago) to now, in the current
        context (the acquiring thread's or task's: signals run there)."""
        now = time.time_ns()
        span = self.tracer.start_span(
            "distlock.acquire", start_time=now - int(waited * 1e9),
            attributes={**attributes, "distlock.outcome": outcome, "distlock.wait": waited},
        )
        if error is not None:
            span.record_exception(error, timestamp=now)
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        elif outcome != "acquired":
            span.set_status(Status(StatusCode.ERROR, f"not acquired: {outcome}"))
        span.end(end_time=now)
        self.wait.record(waited, {**_metric(attributes), "distlock.outcome": outcome})


def _attributes(handle: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    backend = kwargs.get("backend")
    return {
        "distlock.name": kwargs.get("name", ""),
        "distlock.alias": kwargs.get("alias", ""),
        "distlock.backend": type(backend).__name__ if backend is not None else "",
        "distlock.kind": str(getattr(handle.kind, "value", handle.kind)),
    }


def _metric(attributes: dict[str, Any]) -> dict[str, Any]:
    """A metric's attributes: the alias and the kind, never the name (cardinality)."""
    return {"distlock.alias": attributes["distlock.alias"],
            "distlock.kind": attributes["distlock.kind"]}
