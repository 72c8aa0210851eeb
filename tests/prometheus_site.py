"""A tiny WSGI app (``app``, for gunicorn workers) and its ASGI twin (``asgi_app``, for
``uvicorn --workers``) for tests/test_prometheus_multiprocess.py, run with
``PROMETHEUS_MULTIPROC_DIR`` set: ``/hold?ms=N`` takes a lock of the ``redis``
alias and holds it N ms (writing the worker's pid to ``?pidfile=`` first, when given),
answering the worker's pid; ``/metrics`` is the scrape, every worker's added up."""

from __future__ import annotations

import asyncio
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
from django_distlock.contrib import prometheus  # noqa: E402

prometheus.install()


def _serve(path: str, query_string: str) -> tuple[bytes, str]:
    """The body and content type of ``path`` (``/metrics`` or ``/hold``)."""
    query = {key: values[0] for key, values in parse_qs(query_string).items()}
    if path == "/metrics":
        return generate_latest(prometheus.scrape_registry()), CONTENT_TYPE_LATEST
    if "pidfile" in query:
        with open(query["pidfile"], "w") as out:
            out.write(str(os.getpid()))
    with locks["redis"].lock(f"prometheus:{uuid.uuid4().hex}", ttl=30):
        time.sleep(int(query.get("ms", "0")) / 1000)
    return str(os.getpid()).encode(), "text/plain"


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Serve ``/metrics`` and ``/hold`` (WSGI)."""
    body, kind = _serve(environ["PATH_INFO"], environ.get("QUERY_STRING", ""))
    start_response("200 OK", [("Content-Type", kind)])
    return [body]


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Serve ``/metrics`` and ``/hold`` (ASGI; the sync code in a thread, as Django's
    ``sync_to_async`` runs a sync view)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    query = scope.get("query_string", b"").decode()
    body, kind = await asyncio.to_thread(_serve, scope["path"], query)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", kind.encode())]})
    await send({"type": "http.response.body", "body": body})
