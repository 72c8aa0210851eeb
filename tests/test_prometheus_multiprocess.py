"""Prometheus under a pool of worker processes (gunicorn, 3 sync workers, multiprocess
mode): the scraped acquisitions total equals the requests that took a lock, whichever
worker served them; the held gauge rises while requests hold and falls back to 0, also
when a worker holding a lock is killed (gunicorn's child_exit hook). And, in-process,
the gauges of locks held and of the oldest hold."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import RequestFactory
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from django_distlock import locks
from django_distlock.contrib import prometheus
from django_distlock.handle import hold_of

from .conftest import require_redis

ROOT = Path(__file__).resolve().parent.parent
GUNICORN = Path(sys.executable).with_name("gunicorn")
UVICORN = Path(sys.executable).with_name("uvicorn")
WORKERS, REQUESTS = 3, 30


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return str(answer.read().decode())


def _sample(text: str, name: str, alias: str = "redis") -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("alias") == alias:
                return float(sample.value)
    return None


def _start(tmp_path: Path, command: list[str], name: str) -> Iterator[str]:
    """Run ``command`` (a server of tests/prometheus_site.py on ``{port}``) in
    multiprocess mode until the test ends; yield its base URL once it answers."""
    require_redis()
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    port = _free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
           "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    logfile = tmp_path / f"{name}.log"
    log = logfile.open("w")
    server = subprocess.Popen(
        [part.format(port=port) for part in command],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(url + "/metrics", timeout=5)
                break
            except OSError:
                assert server.poll() is None, logfile.read_text()
                assert time.monotonic() < deadline, f"{name} did not start"
                time.sleep(0.2)
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[str]:
    """gunicorn serving tests/prometheus_site.py with 3 sync workers; its base URL."""
    config = tmp_path / "gunicorn.conf.py"
    # The documented setup (docs/admin-dashboard.md): the hook drops a dead worker's
    # live gauges.
    config.write_text("from django_distlock.contrib.prometheus import child_exit  # noqa\n")
    yield from _start(tmp_path, [
        str(GUNICORN), "-c", str(config), "-w", str(WORKERS), "-k", "sync",
        "-b", "127.0.0.1:{port}", "--timeout", "60", "tests.prometheus_site:app",
    ], "gunicorn")


@pytest.fixture
def uvicorn_site(tmp_path: Path) -> Iterator[str]:
    """Plain ``uvicorn --workers 3`` (its own supervisor, no gunicorn) serving
    tests/prometheus_site.py's ASGI app; its base URL."""
    if not UVICORN.exists():
        if os.environ.get("DISTLOCK_SERVERS"):
            pytest.fail(f"{UVICORN} is missing (in the test extras (setup.cfg))")
        pytest.skip("uvicorn is not installed")
    yield from _start(tmp_path, [
        str(UVICORN), "--workers", str(WORKERS), "--host", "127.0.0.1", "--port", "{port}",
        "--log-level", "warning", "tests.prometheus_site:asgi_app",
    ], "uvicorn")


def _cut_short(url: str) -> None:
    """A request whose worker is killed: its connection ends without an answer."""
    with contextlib.suppress(OSError):
        _get(url)


def _kill_a_holder(site: str, tmp_path: Path) -> None:
    """SIGKILL the worker serving a request while it holds a lock (the gauge shows it)."""
    pidfile = tmp_path / "holder.pid"
    victim = threading.Thread(target=_cut_short, args=(f"{site}/hold?ms=20000&pidfile={pidfile}",))
    victim.start()
    text = _wait_for(site, "distlock_locks_held", 1)
    assert _sample(text, "distlock_locks_held") == 1
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    victim.join(30)


def _wait_for(url: str, name: str, value: float, within: float = 10) -> str:
    deadline = time.monotonic() + within
    while True:
        text = _get(url + "/metrics")
        if _sample(text, name) == value or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def _requests_add_up(site: str) -> str:
    """``REQUESTS`` requests that each take a lock, from 3 client threads, served by at
    least 2 workers: the scraped total is ``REQUESTS``, none held after. The scrape."""
    pids: list[str] = []

    def client(count: int) -> None:
        for _ in range(count):
            pids.append(_get(site + "/hold?ms=20"))

    clients = [threading.Thread(target=client, args=(REQUESTS // 3,)) for _ in range(3)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(60)
    assert len(pids) == REQUESTS
    assert len(set(pids)) >= 2, f"one worker served everything ({set(pids)}): nothing summed"
    text = _get(site + "/metrics")
    assert _sample(text, "distlock_acquisitions_total") == REQUESTS
    assert _sample(text, "distlock_locks_held") == 0
    return text


def test_the_scraped_totals_add_up_across_workers(site: str, tmp_path: Path) -> None:
    text = _requests_add_up(site)
    assert _sample(text, "distlock_oldest_hold_acquired_timestamp_seconds") == math.inf

    # Two requests hold for 3 s (two workers); the third worker answers the scrapes.
    began = time.time()
    holders = [threading.Thread(target=_get, args=(site + "/hold?ms=3000",)) for _ in range(2)]
    for thread in holders:
        thread.start()
    text = _wait_for(site, "distlock_locks_held", 2)
    assert _sample(text, "distlock_locks_held") == 2
    oldest = _sample(text, "distlock_oldest_hold_acquired_timestamp_seconds")
    assert oldest is not None and began - 1 <= oldest <= time.time()
    for thread in holders:
        thread.join(60)
    text = _wait_for(site, "distlock_locks_held", 0)
    assert _sample(text, "distlock_locks_held") == 0
    assert _sample(text, "distlock_acquisitions_total") == REQUESTS + 2

    # A worker killed while it holds: child_exit drops its live gauge (the lock itself
    # expires on Redis); its counts stay in the totals.
    _kill_a_holder(site, tmp_path)
    text = _wait_for(site, "distlock_locks_held", 0)
    assert _sample(text, "distlock_locks_held") == 0
    assert _sample(text, "distlock_acquisitions_total") == REQUESTS + 3


def test_the_scraped_totals_add_up_across_plain_uvicorn_workers(
    uvicorn_site: str, tmp_path: Path
) -> None:
    """``uvicorn --workers 3``: the same totals; a worker SIGKILLed while holding is
    replaced by uvicorn's supervisor, which has no hook: its hold stays in the gauge (the
    documented limit) while its acquisition counts."""
    _requests_add_up(uvicorn_site)
    holders = [
        threading.Thread(target=_get, args=(uvicorn_site + "/hold?ms=3000",)) for _ in range(2)
    ]
    for thread in holders:
        thread.start()
    text = _wait_for(uvicorn_site, "distlock_locks_held", 2)
    assert _sample(text, "distlock_locks_held") == 2
    for thread in holders:
        thread.join(60)
    text = _wait_for(uvicorn_site, "distlock_locks_held", 0)
    assert _sample(text, "distlock_acquisitions_total") == REQUESTS + 2

    _kill_a_holder(uvicorn_site, tmp_path)
    # The replacement worker answers; the dead one's files are still read as live.
    deadline = time.monotonic() + 20
    while True:
        try:
            text = _get(uvicorn_site + "/metrics", timeout=5)
            break
        except OSError:
            assert time.monotonic() < deadline, "no worker answers after the kill"
            time.sleep(0.2)
    assert _sample(text, "distlock_acquisitions_total") == REQUESTS + 3
    assert _sample(text, "distlock_locks_held") == 1


# -- in-process --------------------------------------------------------------------------


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    prometheus.uninstall()
    registry = CollectorRegistry()
    prometheus.install(registry)
    yield registry
    prometheus.uninstall()


def _value(registry: CollectorRegistry, name: str, alias: str = "redis") -> Any:
    return registry.get_sample_value(name, {"alias": alias})


def test_the_gauges_follow_holds(registry: CollectorRegistry, unique: Any) -> None:
    require_redis()  # a backend with reentrant locks
    held, oldest = "distlock_locks_held", "distlock_oldest_hold_acquired_timestamp_seconds"
    backend = locks["redis"]
    first = backend.lock(unique("a"), ttl=30)
    began = time.time()
    first.acquire()
    second = backend.lock(unique("b"), ttl=30, reentrant=True)
    second.acquire()
    second.acquire()  # reentrant: still one hold
    assert _value(registry, held) == 2
    assert began - 1 <= _value(registry, oldest) <= time.time()
    first_at = _value(registry, oldest)
    first.release()
    assert _value(registry, held) == 1 and _value(registry, oldest) >= first_at
    second.release()
    assert _value(registry, held) == 1  # the outer hold remains
    hold_of(second).mark_lost()  # lost: the hold is over
    assert _value(registry, held) == 0 and _value(registry, oldest) == math.inf
    # A handle dropped while held stops counting at the next event.
    dropped = backend.lock(unique("c"), ttl=30)
    dropped.acquire()
    assert _value(registry, held) == 1
    del dropped
    gc.collect()
    with backend.lock(unique("d"), ttl=30):
        assert _value(registry, held) == 1
    assert _value(registry, held) == 0


def test_the_metrics_view_serves_the_default_registry() -> None:
    prometheus.uninstall()
    prometheus.install()
    try:
        answer = prometheus.metrics_view(RequestFactory().get("/metrics"))
    finally:
        prometheus.uninstall()
    assert answer.status_code == 200 and b"distlock_acquisitions_total" in answer.content
