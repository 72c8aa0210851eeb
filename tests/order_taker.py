"""A process that takes two locks one inside the other, audited, and exits
(tests/test_ordering.py: the orders seen across processes, from the audit trail).

``python -m tests.order_taker DATABASE_JSON FIRST SECOND``: ``DATABASE_JSON`` is the
``DATABASES["default"]`` entry the audit trail is written to; the process holds the
lock ``FIRST`` while it takes ``SECOND`` (the checker is off: this process alone sees
no inversion), releases both, and prints its pid.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from tests.audited_process import configure


def main(database: dict[str, Any], first: str, second: str) -> None:
    configure(database, DISTLOCK_CHECK_ORDER=False)
    from django_distlock import locks
    from django_distlock.contrib.audit.recorder import recorder

    with locks["default"].lock(first, timeout=5), locks["default"].lock(second, timeout=5):
        pass
    recorder.flush()
    print(os.getpid())


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3])
