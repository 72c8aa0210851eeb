"""A tiny WSGI app for tests/test_prometheus_multiprocess.py, run by gunicorn workers
with ``PROMETHEUS_MULTIPROC_DIR`` set: ``/hold?ms=N`` takes a lock of the ``redis``
alias and holds it N ms (writing the worker's pid to ``?pidfile=`` first, when given),
answering the worker's pid; ``/metrics`` is the scrape, every worker's added up."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # noqa: E402

from django_distlock import locks  # noqa: E402
from django_distlock.integrations import prometheus  # noqa: E402

prometheus.install()


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Serve ``/metrics`` and ``/hold``."""
    query = {key: values[0] for key, values in parse_qs(environ.get("QUERY_STRING", "")).items()}
    if environ["PATH_INFO"] == "/metrics":
        body, kind = generate_latest(prometheus.scrape_registry()), CONTENT_TYPE_LATEST
    else:
        if "pidfile" in query:
            with open(query["pidfile"], "w") as out:
                out.write(str(os.getpid()))
        with locks["redis"].lock(f"prometheus:{uuid.uuid4().hex}", ttl=30):
            time.sleep(int(query.get("ms", "0")) / 1000)
        body, kind = str(os.getpid()).encode(), "text/plain"
    start_response("200 OK", [("Content-Type", kind)])
    return [body]
