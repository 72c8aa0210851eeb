"""A lock client whose wall clock tests/test_clock.py jumps: run as ``python -m
tests.clock_client ALIAS`` under libfaketime, with the test databases' names in
``DISTLOCK_CLOCK_DATABASES`` (JSON). It reads one command a line on stdin (``acquire
NAME TTL``, ``state NAME``, ``release NAME``) and answers each with one JSON line on
stdout, always with its clocks (``wall``, ``mono``)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from django_distlock.handle import hold_of


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django
    from django.conf import settings

    for alias, name in json.loads(os.environ["DISTLOCK_CLOCK_DATABASES"]).items():
        settings.DATABASES[alias]["NAME"] = name
    django.setup()


def _answer(alias: str, handles: dict[str, Any], line: str) -> dict[str, Any]:
    from django_distlock import locks

    command, name, *rest = line.split()
    if command == "acquire":
        handle = locks[alias].lock(name, ttl=float(rest[0]))
        won = bool(handle.acquire(blocking=False))
        if won:
            handles[name] = handle
        return {"won": won, "valid_until": hold_of(handle).valid_until}
    handle = handles[name]
    if command == "release":
        handles.pop(name).release()
        return {"released": True}
    return {"valid_until": hold_of(handle).valid_until, "lost": handle.lost}


def main() -> None:
    _setup()
    alias, handles = sys.argv[1], {}
    print(json.dumps({"ready": True, "wall": time.time(), "mono": time.monotonic()}), flush=True)
    for line in sys.stdin:
        try:
            reply = _answer(alias, handles, line)
        except Exception as exc:  # reported to the test, which decides
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        reply.update(wall=time.time(), mono=time.monotonic())
        print(json.dumps(reply), flush=True)
    from django_distlock import locks

    locks.close_all()


if __name__ == "__main__":
    main()
