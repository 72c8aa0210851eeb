"""Prometheus metrics of lock events (``pip install django-distlock[prometheus]``).

Call :func:`install` once (an ``AppConfig.ready``, say), then expose the
registry as usual (``prometheus_client.make_wsgi_app()``, django-prometheus...):

- ``distlock_acquisitions_total``, ``distlock_acquire_failures_total`` (timed out
  or busy), ``distlock_lost_total``, ``distlock_force_releases_total``: counters;
- ``distlock_wait_seconds`` (time in ``acquire()``) and ``distlock_hold_seconds``
  (acquire to release): histograms;

each labelled by ``alias``. The receivers only update in-process metrics: no I/O
on the hot path.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from .. import signals

#: Seconds: lock waits and holds run from microseconds to minutes.
BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


class Metrics(NamedTuple):
    acquired: Counter
    failed: Counter
    lost: Counter
    force_released: Counter
    wait: Histogram
    hold: Histogram


_installed: tuple[Metrics, CollectorRegistry] | None = None


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
    )
    for signal, receiver in _receivers(metrics).items():
        signal.connect(receiver, weak=False, dispatch_uid=f"distlock-prometheus-{id(signal)}")
    _installed = metrics, registry
    return metrics


def uninstall() -> None:
    """Disconnect the receivers and unregister the metrics (for tests)."""
    global _installed
    installed, _installed = _installed, None
    if installed is None:
        return
    metrics, registry = installed
    for signal in _receivers(metrics):
        signal.disconnect(dispatch_uid=f"distlock-prometheus-{id(signal)}")
    for metric in metrics:
        registry.unregister(metric)


def _receivers(m: Metrics) -> dict[Any, Any]:
    def acquired(sender: Any, alias: str, waited: float = 0.0, **kwargs: Any) -> None:
        m.acquired.labels(alias).inc()
        m.wait.labels(alias).observe(waited)

    def failed(sender: Any, alias: str, waited: float = 0.0, **kwargs: Any) -> None:
        m.failed.labels(alias).inc()
        m.wait.labels(alias).observe(waited)

    def released(sender: Any, alias: str, handle: Any = None, **kwargs: Any) -> None:
        held_for = getattr(handle, "held_for", None)
        if held_for is not None:
            m.hold.labels(alias).observe(held_for)

    def lost(sender: Any, alias: str, **kwargs: Any) -> None:
        m.lost.labels(alias).inc()

    def force_released(sender: Any, alias: str, **kwargs: Any) -> None:
        m.force_released.labels(alias).inc()

    return {
        signals.lock_acquired: acquired,
        signals.lock_not_acquired: failed,
        signals.lock_released: released,
        signals.lock_lost: lost,
        signals.lock_force_released: force_released,
    }
