"""The partitioned client of tests/test_partitions.py: one process, driven line by line.

Run as ``python -m tests.partitioned HISTORY`` (in a test namespace) with the
``DISTLOCK_*`` variables naming the forwarders instead of the servers, and
``DISTLOCK_STORAGE_HOST``/``_PORT`` a path to PostgreSQL the partitions leave alone
(the fenced storage). Each line read on stdin is a JSON command, answered by one
JSON line on stdout: ``acquire``, ``extend``, ``release``, ``write``, ``status``,
``exit``. Every call reports how long it took and what it raised (the class, and
whether it is a library exception). The hold is recorded with
:class:`~django_distlock.testing.history.HistoryRecorder`; a thread notes when the
handle first turned ``lost`` or ``unsure``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from django_distlock.handle import hold_of


def _configure() -> None:
    """The test settings, with a ``storage`` database and a ZooKeeper host order kept."""
    from django.conf import settings

    from tests import settings as base

    conf = {k: getattr(base, k) for k in dir(base) if k.isupper()}
    pg = conf["DATABASES"]["pg"]
    conf["DATABASES"]["storage"] = {
        **pg, "HOST": os.environ["DISTLOCK_STORAGE_HOST"],
        "PORT": os.environ["DISTLOCK_STORAGE_PORT"],
        "NAME": pg["NAME"], "TEST": {"NAME": pg["NAME"]},
    }
    # Transaction mode's lock is the caller's own connection, which the library does not
    # cut: a user's libpq settings for a network that can vanish bound its calls (see
    # docs/faults.md). Its own database alias, so that lease mode runs without them.
    conf["DATABASES"]["pgtx"] = {**pg, "OPTIONS": {
        "connect_timeout": 2, "keepalives_idle": 1, "keepalives_interval": 1,
        "keepalives_count": 2, "tcp_user_timeout": 2000}}
    if "pg-tx" in conf["DISTLOCK"]:
        conf["DISTLOCK"]["pg-tx"]["OPTIONS"]["DATABASE"] = "pgtx"
    if "zk" in conf["DISTLOCK"]:  # the first host first: the test puts the leader there
        conf["DISTLOCK"]["zk"]["OPTIONS"]["CLIENT_OPTIONS"] = {"randomize_hosts": False}
    settings.configure(**conf)
    import django

    django.setup()


class Client:
    """One handle at a time, its recorded hold, and the time its loss was first seen."""

    def __init__(self, history: str) -> None:
        from django_distlock.testing.history import HistoryRecorder

        self.rec = HistoryRecorder(history)
        self.handle: Any = None
        self.op: Any = None
        self.seen: dict[str, float] = {}
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            handle = self.handle
            if handle is not None:
                for what in ("lost", "unsure"):
                    if getattr(hold_of(handle), what) and what not in self.seen:
                        self.seen[what] = time.monotonic()
            time.sleep(0.005)

    def acquire(self, alias: str, name: str, ttl: float, auto_renew: bool = False,
                timeout: float = 10) -> dict[str, Any]:
        from django_distlock import locks

        handle = locks[alias].lock(name, ttl=ttl, auto_renew=auto_renew)
        self.op = self.rec.invoke(name)
        assert handle.acquire(timeout=timeout), "not granted"
        self.rec.granted(self.op, handle.fencing_token, hold_of(handle).valid_until)
        self.handle, self.seen = handle, {}
        return {"token": handle.fencing_token, "valid_until": hold_of(handle).valid_until}

    def extend(self) -> dict[str, Any]:
        self.handle.extend()
        return {"valid_until": hold_of(self.handle).valid_until}

    def end(self) -> dict[str, Any]:
        """Record the end of the hold (a loss first, when seen), as ``hold()`` would."""
        handle, now = self.handle, time.monotonic()
        if hold_of(handle).valid_until is not None:
            self.rec.renewed(self.op, hold_of(handle).valid_until)
        for what in ("lost", "unsure"):
            if what in self.seen or getattr(hold_of(handle), what):
                at = min(self.seen.get(what, now), hold_of(handle).valid_until or now)
                getattr(self.rec, what)(self.op, at)
        self.rec.released(self.op)
        return {}

    def release(self) -> dict[str, Any]:
        self.handle.release()
        return {}

    def write(self, pk: int, label: str) -> dict[str, Any]:
        """A fenced write with the handle's token, through the unpartitioned path."""
        from django_distlock.exceptions import StaleFencingToken
        from tests.testapp.models import FencedItem

        token, began = self.handle.fencing_token, time.monotonic_ns()
        item = FencedItem.objects.using("storage").get(pk=pk)
        item.label = label
        try:
            item.fenced_save(token, using="storage")
            accepted = True
        except StaleFencingToken:
            accepted = False
        self.rec.write(self.handle.name, token, accepted=accepted, began=began)
        return {"accepted": accepted}

    def rounds(self, alias: str, name: str, seconds: float, ttl: float, timeout: float,
               hold: float) -> dict[str, Any]:
        """Contend for ``name`` for ``seconds``: fenced holds of ``hold`` s, recorded; the
        counts, the slowest acquire and release, and any non-library exception."""
        from django_distlock import locks
        from django_distlock.exceptions import DistLockError, LockNotAcquired

        backend, end = locks[alias], time.monotonic() + seconds
        out: dict[str, Any] = {"held": 0, "missed": 0, "errors": [], "raw": [],
                               "acquire": 0.0, "release": 0.0}
        while time.monotonic() < end:
            handle, began, step = backend.lock(name, ttl=ttl), time.monotonic(), "acquire"
            try:
                with self.rec.hold(handle):
                    out["acquire"] = max(out["acquire"], time.monotonic() - began)
                    if backend.supports_fencing:
                        self.rec.write(name, handle.fencing_token, accepted=True)
                    time.sleep(hold)
                    began, step = time.monotonic(), "release"
                out["release"] = max(out["release"], time.monotonic() - began)
                out["held"] += 1
            except LockNotAcquired:
                out["missed"] += 1
            except DistLockError as exc:
                out[step] = max(out[step], time.monotonic() - began)
                out["errors"].append(f"{step}: {type(exc).__name__}: {exc}"[:200])
            except Exception as exc:
                out["raw"].append(f"{step}: {type(exc).__module__}.{type(exc).__name__}: {exc}")
        return out

    def status(self) -> dict[str, Any]:
        handle = self.handle
        return {"lost": handle.lost, "unsure": hold_of(handle).unsure, "seen": self.seen,
                "valid_until": hold_of(handle).valid_until, "now": time.monotonic()}


def main() -> None:
    """Answer commands until ``exit`` or the end of stdin."""
    _configure()
    from django_distlock.exceptions import DistLockError

    client = Client(sys.argv[1])
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "exit":
            break
        began = time.monotonic()
        reply: dict[str, Any] = {}
        try:
            reply = getattr(client, op)(**command)
        except BaseException as exc:  # what escapes is the finding: report it
            reply = {"error": f"{type(exc).__module__}.{type(exc).__qualname__}",
                     "library": isinstance(exc, DistLockError), "message": str(exc)[:300]}
        reply.update(began=began, took=time.monotonic() - began)
        print(json.dumps(reply, default=str), flush=True)
    from django_distlock import locks

    locks.close_all()


if __name__ == "__main__":
    main()
