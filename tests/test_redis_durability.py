"""Redis servers that come back with older state than they had: a restart from an RDB
snapshot, a Redlock master restarted empty or from its fsynced append-only file.

Each test starts its own ``redis-server`` (``tests/test_redis_faults.py``'s
:class:`Server`) and SIGKILLs it under holders.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from django_distlock.backends.redis import RedisBackend, RedlockBackend
from django_distlock.contrib.optimistic.fencing import fenced_save
from django_distlock.exceptions import LockLost, StaleFencingToken
from tests.testapp.models import FencedItem

from .figures import record
from .private_redis import Server


@pytest.fixture
def snapshotted(own_redis: Server) -> Server:
    return own_redis


@pytest.mark.django_db(transaction=True)
def test_tokens_keep_growing_after_a_restart_from_an_older_snapshot(
    snapshotted: Server,
) -> None:
    """The server comes back from a snapshot taken before the last grants (Redis'
    default configuration saves one): the fencing counter it restores is older than
    tokens already issued. The next token must still be larger than every one of them,
    so that the storage keeps refusing the old holders' writes and accepts the new one's.
    """
    backend = RedisBackend("own", {"LOCATION": snapshotted.url(), "TTL": 30})
    admin = redis.Redis.from_url(snapshotted.url())
    try:
        tokens = []
        first = backend.lock("snap-a", ttl=30)
        assert first.acquire(blocking=False)
        tokens.append(first.fencing_token)
        assert admin.save()  # the snapshot: the counter as it is now
        first.release()
        for _ in range(3):  # grants the snapshot does not know of
            later = backend.lock("snap-a", ttl=30)
            assert later.acquire(blocking=False)
            tokens.append(later.fencing_token)
            later.release()
        last = backend.lock("snap-a", ttl=30)
        assert last.acquire(blocking=False)
        tokens.append(last.fencing_token)
        item = FencedItem.objects.create(label="init", stock=10)
        fenced_save(item, last)  # the last holder wrote
        assert tokens == sorted(set(tokens))
        snapshotted.kill()  # SIGKILL: no save at exit
        snapshotted.start()  # loads dump.rdb
        assert admin.exists(backend.keys_for(backend.make_key("snap-a")).seq)  # old state
        newcomer = backend.lock("snap-b", ttl=30)  # same tag, same counter
        assert newcomer.acquire(blocking=False)
        record("restart", "redis (older snapshot)", grants=len(tokens) + 1,
               repeated_tokens=int(newcomer.fencing_token <= max(tokens)))
        assert newcomer.fencing_token > max(tokens), (newcomer.fencing_token, tokens)
        fresh = FencedItem.objects.get(pk=item.pk)
        fresh.label = "newcomer"
        fenced_save(fresh, newcomer)  # the new holder's write is accepted ...
        item.label = "stale"
        with pytest.raises(StaleFencingToken):
            fenced_save(item, tokens[-1])  # ... and the old holder's is refused
        assert FencedItem.objects.get(pk=item.pk).label == "newcomer"
        newcomer.release()
    finally:
        admin.close()
        backend.close()


#: The configuration the Redlock algorithm needs of each master: every write fsynced
#: before the reply, so a master restarted after a crash still has the locks it granted.
FSYNCED = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.mark.parametrize(
    ("options", "second_holder"), [((), True), (FSYNCED, False)], ids=["no-persistence", "fsync"]
)
def test_a_redlock_master_restarted_empty_lets_a_second_holder_in(
    tmp_path: Path, options: tuple[str, ...], second_holder: bool
) -> None:
    """Redlock's known requirement (docs/redis.md): a master that forgets the locks it
    granted (restarted empty) can make a second majority while the first holder still
    holds. The holder's grant came from A and B (C was down); A restarts: empty, it
    grants again, and with C, restarted meanwhile, that is a majority. With every
    write fsynced A comes back with the key and refuses."""
    masters = []
    for name in "abc":
        (tmp_path / name).mkdir()
        masters.append(Server(tmp_path / name, options))
    for master in masters:
        master.start()
    a, _, c = masters
    backend = RedlockBackend(
        "own",
        {"LOCATION": [m.url() for m in masters], "OPTIONS": {"NODE_TIMEOUT": 0.5}, "TTL": 30},
    )
    try:
        c.kill()
        holder = backend.lock("restarted", ttl=30)
        assert holder.acquire(blocking=False)  # granted by A and B
        c.start()
        a.kill()  # SIGKILL: a crash
        a.start()  # empty, or from its append-only file
        second = backend.lock("restarted", ttl=30)
        got = second.acquire(blocking=False)
        record("restart", f"redlock ({'fsync' if options else 'no persistence'})",
               overlaps=int(got and holder.held))
        assert got is second_holder
        assert holder.held  # the first holder's lease runs on
        if second_holder:
            second.release()
            with pytest.raises(LockLost):
                holder.release()  # B alone held it: the holder learns it too late
        else:
            holder.release()
    finally:
        backend.close()
        for master in masters:
            master.kill()
