"""A process that records lock events and exits at once (tests/test_audit_recorder.py).

``python -m tests.audit_exit DATABASE_JSON HOW``: ``DATABASE_JSON`` is the
``DATABASES["default"]`` entry; ``HOW`` is ``exit`` (return from main), ``sigterm``
(a SIGTERM handler that calls ``sys.exit``, as gunicorn's workers do; "ready" is
printed when the events are queued) or ``stuck`` (like exit, its database never answers).
It releases :data:`EVENTS` holds and exits holding :data:`OPEN` more.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any

from tests.audited_process import configure

#: Holds released before the exit (one row each) ...
EVENTS = 400
#: ... and holds still open at the exit (an ``acquired`` row each).
OPEN = 3
STUCK_EXIT_TIMEOUT = 1.0


def main(database: dict[str, Any], how: str) -> None:
    configure(database)
    from django_distlock import locks
    from django_distlock.contrib.audit import recorder

    if how == "stuck":
        recorder.EXIT_TIMEOUT = STUCK_EXIT_TIMEOUT  # the bound, shortened for the test

    if how == "sigterm":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    for index in range(EVENTS):  # a row each, written at its release
        with locks["default"].lock(f"exit:{how}:{index}", ttl=30):
            pass
    held = [locks["default"].lock(f"exit:{how}:open:{i}", ttl=30) for i in range(OPEN)]
    for handle in held:
        handle.acquire()
    print("ready", flush=True)
    if how == "sigterm":
        time.sleep(60)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
