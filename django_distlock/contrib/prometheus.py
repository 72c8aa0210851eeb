"""Prometheus metrics of lock events (``pip install django-distlock[prometheus]``).

Call :func:`install` once (an ``AppConfig.ready``, say), then expose the
registry as usual (``prometheus_client.make_wsgi_app()``, django-prometheus...):

- ``distlock_acquisitions_total``, ``distlock_acquire_failures_total`` (timed out
  or busy), ``distlock_acquire_errors_total`` (``acquire()`` raised: the server failed
  or refused the wait), ``distlock_lost_total``, ``distlock_force_releases_total``:
  counters;
- ``distlock_wait_seconds`` (time in ``acquire()``) and ``distlock_hold_seconds``
  (acquire to release): histograms;
- ``distlock_locks_held``: locks this site holds now (gauge, summed over live worker
  processes);
- ``distlock_oldest_hold_acquired_timestamp_seconds``: when the oldest of them was
  acquired (Unix time; the smallest over live processes; ``+Inf`` when none is held):
  its age is ``time() - ...``;

each labelled by ``alias``. The receivers only update in-process metrics: no I/O
on the hot path.

Under a pool of worker processes (gunicorn, ``uvicorn --workers``), each process
counts its own events: set ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's
multiprocess mode) and serve :func:`metrics_view`, which adds up every process'
files; call :func:`child_exit` from gunicorn's ``child_exit`` hook so a dead
worker's held locks stop counting (docs/admin-dashboard.md).
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from typing import Any, NamedTuple

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from django_distlock import signals

__all__ = ["Metrics", "child_exit", "install", "metrics_view", "scrape_registry", "uninstall"]

#: prometheus_client's environment variable naming the multiprocess mode's directory.
MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"

#: Seconds: lock waits and holds run from microseconds to minutes.
BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


class Metrics(NamedTuple):
    acquired: Counter
    failed: Counter
    errors: Counter
    lost: Counter
    force_released: Counter
    wait: Histogram
    hold: Histogram
    held: Gauge
    oldest: Gauge


class Holds:
    """This process' holds per alias, kept for the two gauges: a hold counts from its
    first ``lock_acquired`` (a reentrant handle's inner ones deepen it) to the matching
    ``lock_released``, or its ``lock_lost``, or (seen at the next event) its handle being
    garbage-collected while held."""

    def __init__(self, held: Gauge, oldest: Gauge) -> None:
        self.held, self.oldest = held, oldest
        self.mutex = threading.Lock()
        #: alias -> id(handle) -> [acquired (Unix time), depth, finalizer, tag]
        self.by_alias: dict[str, dict[int, list[Any]]] = {}
        # Handles collected while held: (alias, id, finalizer). Only appended to by the
        # finalizer (which may run inside any allocation, this class' own included), and
        # emptied under the mutex at the next event.
        self.collected: list[tuple[str, int, object]] = []

    def acquired(self, alias: str, handle: Any) -> None:
        """Count ``handle``'s grant (or deepen its reentrant hold)."""
        with self.mutex:
            self._sweep()
            holds = self.by_alias.setdefault(alias, {})
            entry = holds.get(id(handle))
            if entry is not None:
                entry[1] += 1
                return
            tag = object()  # tells this entry from a later handle's of the same id
            gone = weakref.finalize(handle, self.collected.append, (alias, id(handle), tag))
            gone.atexit = False
            holds[id(handle)] = [time.time(), 1, gone, tag]
            self._publish(alias, holds)

    def ended(self, alias: str, key: int, whole: bool) -> None:
        """End a hold (``whole``: lost) or one level of it (released)."""
        with self.mutex:
            self._sweep()
            holds = self.by_alias.get(alias, {})
            entry = holds.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if whole or entry[1] <= 0:
                self._drop(alias, holds, key)

    def _drop(self, alias: str, holds: dict[int, list[Any]], key: int) -> None:
        entry = holds.pop(key)
        entry[2].detach()
        self._publish(alias, holds)

    def _sweep(self) -> None:
        while self.collected:
            alias, key, tag = self.collected.pop()
            holds = self.by_alias.get(alias, {})
            entry = holds.get(key)
            if entry is not None and entry[3] is tag:
                self._drop(alias, holds, key)

    def _publish(self, alias: str, holds: dict[int, list[Any]]) -> None:
        self.held.labels(alias).set(len(holds))
        since = [entry[0] for entry in tuple(holds.values())]
        self.oldest.labels(alias).set(min(since, default=math.inf))

    def forget(self) -> None:
        """In a forked child: the parent's holds are not this process'."""
        self.mutex = threading.Lock()
        self.by_alias, self.collected = {}, []


_installed: tuple[Metrics, CollectorRegistry, Holds] | None = None


def _forget_in_child() -> None:
    if _installed is not None:
        _installed[2].forget()


os.register_at_fork(after_in_child=_forget_in_child)


def install(registry: CollectorRegistry = REGISTRY) -> Metrics:
    """Create the metrics in ``registry`` and connect the signal receivers; a second
    call returns the metrics of the first.

    :returns: the metrics.
    """
    global _installed
    if _installed is not None:
        return _installed[0]
    metrics = Metrics(
        Counter("distlock_acquisitions", "Locks acquired", ["alias"], registry=registry),
        Counter(
            "distlock_acquire_failures", "Acquires that timed out or found the lock busy",
            ["alias"], registry=registry,
        ),
        Counter(
            "distlock_acquire_errors", "Acquires that raised (the server failed or refused)",
            ["alias"], registry=registry,
        ),
        Counter("distlock_lost", "Held locks found lost", ["alias"], registry=registry),
        Counter(
            "distlock_force_releases", "Locks force-released", ["alias"], registry=registry
        ),
        Histogram(
            "distlock_wait_seconds", "Time spent in acquire()", ["alias"], buckets=BUCKETS,
            registry=registry,
        ),
        Histogram(
            "distlock_hold_seconds", "Time from acquire to release", ["alias"],
            buckets=BUCKETS, registry=registry,
        ),
        # Multiprocess mode: the sum, and the smallest, over live processes only (a
        # dead worker's files go with child_exit()); a process holding none shows 0 and
        # +Inf, which neither the sum nor the smallest sees.
        Gauge(
            "distlock_locks_held", "Locks held now", ["alias"], registry=registry,
            multiprocess_mode="livesum",
        ),
        Gauge(
            "distlock_oldest_hold_acquired_timestamp_seconds",
            "When the oldest lock held now was acquired (Unix time; +Inf: none held)",
            ["alias"], registry=registry, multiprocess_mode="livemin",
        ),
    )
    holds = Holds(metrics.held, metrics.oldest)
    for signal, receiver in _receivers(metrics, holds).items():
        signal.connect(receiver, weak=False, dispatch_uid=f"distlock-prometheus-{id(signal)}")
    _installed = metrics, registry, holds
    return metrics


def uninstall() -> None:
    """Disconnect the receivers and unregister the metrics (for tests)."""
    global _installed
    installed, _installed = _installed, None
    if installed is None:
        return
    metrics, registry, holds = installed
    for signal in _receivers(metrics, holds):
        signal.disconnect(dispatch_uid=f"distlock-prometheus-{id(signal)}")
    for metric in metrics:
        registry.unregister(metric)


def _receivers(m: Metrics, holds: Holds) -> dict[Any, Any]:
    def acquired(sender: Any, alias: str, waited: float = 0.0, handle: Any = None,
                 **kwargs: Any) -> None:
        m.acquired.labels(alias).inc()
        m.wait.labels(alias).observe(waited)
        if handle is not None:
            holds.acquired(alias, handle)

    def failed(sender: Any, alias: str, waited: float = 0.0, **kwargs: Any) -> None:
        m.failed.labels(alias).inc()
        m.wait.labels(alias).observe(waited)

    def errored(sender: Any, alias: str, waited: float = 0.0, **kwargs: Any) -> None:
        m.errors.labels(alias).inc()
        m.wait.labels(alias).observe(waited)

    def released(sender: Any, alias: str, handle: Any = None, **kwargs: Any) -> None:
        held_for = getattr(handle, "held_for", None)
        if held_for is not None:
            m.hold.labels(alias).observe(held_for)
        if handle is not None:
            holds.ended(alias, id(handle), False)

    def lost(sender: Any, alias: str, handle: Any = None, **kwargs: Any) -> None:
        m.lost.labels(alias).inc()
        if handle is not None:
            holds.ended(alias, id(handle), True)

    def force_released(sender: Any, alias: str, **kwargs: Any) -> None:
        m.force_released.labels(alias).inc()

    return {
        signals.lock_acquired: acquired,
        signals.lock_not_acquired: failed,
        signals.lock_acquire_failed: errored,
        signals.lock_released: released,
        signals.lock_lost: lost,
        signals.lock_force_released: force_released,
    }


def scrape_registry() -> CollectorRegistry:
    """The registry a scrape should read: in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``
    set), a new one collecting every process' files; else the default registry.

    :returns: the registry.
    """
    if not os.environ.get(MULTIPROC_DIR):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    """A Django view of the metrics in the text format, every worker's added up in
    multiprocess mode. Route it where only Prometheus reaches it.

    :param request: the request.
    :returns: the exposition.
    """
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn's ``child_exit`` hook (``child_exit = ...`` in the config file): drop the
    dead worker's live gauges, so its held locks stop counting.

    :param server: gunicorn's arbiter.
    :param worker: the worker that exited.
    """
    if os.environ.get(MULTIPROC_DIR):
        multiprocess.mark_process_dead(worker.pid)
