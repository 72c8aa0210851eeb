"""The Celery tasks the real workers of tests/test_celery*.py run (``CELERY_IMPORTS``).

Each task reports what it did to files under the directory it is given (the tests
and the workers share the machine): a history of its holds for the checker, its
pid, the local ports of its connections. Decorator order everywhere:
``@shared_task`` above ``@distlock`` (docs/tasks.md).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import shared_task
from celery.signals import worker_init

from django_distlock import distlock, locks
from django_distlock.contrib.celery.once import QueueOnce
from django_distlock.contrib.celery.retry import retry_task
from django_distlock.testing.history import HistoryRecorder

#: Set in a worker's environment: its main process takes locks before forking its pool
#: and writes the local ports of the connections that opened here.
FORK_PROBE = "DISTLOCK_CELERY_FORK_PROBE"
PROBED = ("redis", "pg-lease")


def note(path: str, what: str, **fields: Any) -> None:
    """Append one JSON line ``{"what": ..., "pid": ..., "t": monotonic, ...}`` to
    ``path/notes.jsonl``."""
    line = json.dumps({"what": what, "pid": os.getpid(), "ppid": os.getppid(),
                       "t": time.monotonic(), **fields}) + "\n"
    with open(os.path.join(path, "notes.jsonl"), "a") as out:
        out.write(line)


def notes(path: str | Path, what: str | None = None) -> list[dict[str, Any]]:
    """The notes under ``path`` (those of ``what`` only, if given)."""
    file = Path(path) / "notes.jsonl"
    if not file.exists():
        return []
    rows = [json.loads(line) for line in file.read_text().splitlines() if line]
    return [row for row in rows if what is None or row["what"] == what]


def _held_body(path: str, name: str, hold: float) -> int:
    """Record a hold of ``name`` around ``hold`` seconds of work (inside the lock, if
    any): the recorded span lies within the real hold, so a recorded overlap is real."""
    rec = HistoryRecorder(os.path.join(path, f"history-{os.getpid()}.jsonl"))
    op = rec.invoke(name)
    rec.granted(op)
    time.sleep(hold)
    rec.released(op)
    rec.close()
    return os.getpid()


@shared_task(bind=True, name="tests.exclusive")
@distlock("celery:{name}", using="redis", ttl=30, timeout=30)
def exclusive(self: Any, path: str, name: str, hold: float) -> int:
    """Hold the Redis lock ``celery:<name>`` for ``hold`` seconds; the pid."""
    return _held_body(path, name, hold)


@shared_task(name="tests.unlocked")
def unlocked(path: str, name: str, hold: float) -> int:
    """The same without a lock: the check must see the overlaps."""
    return _held_body(path, name, hold)


@shared_task(bind=True, name="tests.skipped")
@distlock("celery:{name}", using="redis", blocking=False, on_fail="skip", skip_value="skipped")
def skipped(self: Any, name: str) -> str:
    """Skipped while ``celery:<name>`` is held."""
    return "ran"


@shared_task(bind=True, name="tests.retried", max_retries=20)
@distlock("celery:{name}", using="redis", blocking=False,
          on_fail=retry_task(0.1, factor=2.0, max_countdown=0.4))
def retried(self: Any, path: str, name: str) -> int:
    """Retried (Celery's ``self.retry``) while ``celery:<name>`` is held; the retries."""
    note(path, "retried-ran", retries=self.request.retries)
    return int(self.request.retries)


def _killable(self: Any, path: str, name: str) -> str:
    """First delivery: note the pid and hang (the test kills this child). A redelivery:
    note the grant time and finish."""
    redelivered = bool(notes(path, f"started-{self.request.id}"))
    note(path, f"started-{self.request.id}", redelivered=redelivered)
    if not redelivered:
        time.sleep(60)
    return "done"


@shared_task(bind=True, name="tests.killable_redis", acks_late=True,
             reject_on_worker_lost=True)
@distlock("celery:{name}", using="redis", ttl=2, timeout=30, auto_renew=True)
def killable_redis(self: Any, path: str, name: str) -> str:
    """A lease of 2 s on Redis, renewed while its child lives; the test kills it."""
    return _killable(self, path, name)


@shared_task(bind=True, name="tests.killable_pg_tx", acks_late=True,
             reject_on_worker_lost=True)
@distlock("celery:{name}", using="pg-tx", timeout=30)
def killable_pg_tx(self: Any, path: str, name: str) -> str:
    """A PostgreSQL transaction-mode lock, held by a child the test kills."""
    return _killable(self, path, name)


def _report_lost(exc: Exception, result: Any, self: Any, path: str, name: str,
                 hold: float) -> str:
    note(path, "lost", error=type(exc).__name__)
    return "lost"


@shared_task(bind=True, name="tests.renewed")
@distlock("celery:{name}", using="redis", ttl=1, auto_renew=True, on_lost=_report_lost)
def renewed(self: Any, path: str, name: str, hold: float) -> str:
    """Hold a 1 s lease for ``hold`` seconds, renewed; "lost" when told it was lost."""
    note(path, "renewed-started")
    time.sleep(hold)
    return "kept"


@shared_task(bind=True, name="tests.renewed_long")
@distlock("celery:{name}", using="redis", ttl=2, auto_renew=True, on_lost=_report_lost)
def renewed_long(self: Any, path: str, name: str, hold: float) -> str:
    """Hold a 2 s lease for ``hold`` seconds, renewed."""
    note(path, "renewed-started")
    time.sleep(hold)
    return "kept"


@shared_task(bind=True, name="tests.holds")
@distlock("celery:{name}", using="redis", ttl=30)
def holds(self: Any, path: str, name: str, hold: float) -> str:
    """Hold ``celery:<name>`` for ``hold`` seconds (the test lists it meanwhile)."""
    note(path, "holds-started", task_id=self.request.id)
    time.sleep(hold)
    return str(self.request.id)


# -- prefork: connections a child inherits are not used -------------------------------


def tcp_ports(remote_port: int, pid: int | None = None) -> list[int]:
    """Local ports of ``pid``'s established TCP connections to ``remote_port`` (/proc)."""
    pid = pid or os.getpid()
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if inode in inodes and state == "01" and int(remote.rsplit(":", 1)[1], 16) == (
                remote_port
            ):
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return sorted(ports)


def _server_ports() -> dict[str, int]:
    from django.conf import settings

    from django_distlock.backends.redis.client import host_port

    return {"redis": host_port(settings.REDIS_URL)[1],
            "pg-lease": int(settings.DATABASES["pg"]["PORT"])}


def use_locks(path: str, what: str) -> None:
    """Take and release a lock on each probed alias; note the ports that opened."""
    ports = _server_ports()
    before = {alias: tcp_ports(port) for alias, port in ports.items()}
    for alias in PROBED:
        with locks[alias].lock(f"celery:fork:{os.getpid()}", ttl=30):
            pass
    after = {alias: tcp_ports(port) for alias, port in ports.items()}
    opened = {alias: sorted(set(after[alias]) - set(before[alias])) for alias in ports}
    note(path, what, opened=opened, all=after)


@worker_init.connect
def _probe_before_fork(**kwargs: Any) -> None:
    path = os.environ.get(FORK_PROBE)
    if path:
        use_locks(path, "parent")


@shared_task(name="tests.probe")
def probe(path: str) -> int:
    """In a pool child: use the locks, note the connections that opened."""
    use_locks(path, "child")
    time.sleep(0.3)  # keep this child busy, so the other probes go to other children
    return os.getpid()


# -- enqueue-once ---------------------------------------------------------------------


def _once_body(path: str, n: int, hold: float, fail: bool) -> int:
    note(path, "once-ran", n=n)
    time.sleep(hold)
    if fail:
        raise ValueError("failed on purpose")
    return n


@shared_task(base=QueueOnce, name="tests.once_redis", once={"using": "redis", "key": "once:{n}"})
def once_redis(path: str, n: int, hold: float = 0.0, fail: bool = False) -> int:
    """Enqueue-once on Redis, its lock named by ``n`` only."""
    return _once_body(path, n, hold, fail)


@shared_task(base=QueueOnce, name="tests.once_pg", once={"using": "pg-lease"})
def once_pg(path: str, n: int, hold: float = 0.0, fail: bool = False) -> int:
    """Enqueue-once on a PostgreSQL lease, its lock named by all the arguments."""
    return _once_body(path, n, hold, fail)


@shared_task(base=QueueOnce, name="tests.once_memcached", once={"using": "cache-memcached"})
def once_memcached(path: str, n: int, hold: float = 0.0, fail: bool = False) -> int:
    """Enqueue-once on memcached through the cache backend, its lock named by all the
    arguments."""
    return _once_body(path, n, hold, fail)
