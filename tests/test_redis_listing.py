"""A listing page of a Redis alias whose index is spread over several hash tags (a Redis
Cluster's 16, or ``SHARDS`` on one server) sends every tag's script together: one round
of writes before any reply is read, counted on redis-py's connections. The pages, their
order and their cursors stay those of the tags read one after another."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_distlock import locks
from django_distlock.backends.redis import RedisBackend
from django_distlock.contrib.admin.operations.listing import backend_label
from django_distlock.exceptions import InvalidBackendOptions, UnsupportedOperation

from .conftest import require_redis


class Rounds:
    """The writes and reads of redis-py's sync connections, in order: a write after a read
    starts a round (a wait for the server's replies)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[str] = []
        connection = redis.connection.AbstractConnection
        send, read = connection.send_packed_command, connection.read_response

        def send_packed_command(conn: Any, *args: Any, **kwargs: Any) -> None:
            self.events.append("write")
            send(conn, *args, **kwargs)

        def read_response(conn: Any, *args: Any, **kwargs: Any) -> Any:
            self.events.append("read")
            return read(conn, *args, **kwargs)

        monkeypatch.setattr(connection, "send_packed_command", send_packed_command)
        monkeypatch.setattr(connection, "read_response", read_response)

    def take(self) -> tuple[int, int]:
        """(rounds, writes) since the last take."""
        events, self.events = self.events, []
        rounds = sum(1 for i, e in enumerate(events)
                     if e == "write" and (i == 0 or events[i - 1] == "read"))
        return rounds, events.count("write")


def _all_pages(backend: RedisBackend, prefix: str, limit: int) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = backend.held_locks(prefix=prefix, limit=limit, cursor=cursor)
        pages.append([info.name for info in page])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


@pytest.fixture
def sharded(own_redis: Any) -> Iterator[RedisBackend]:
    """A backend on a private server with its index over 4 tags."""
    backend = RedisBackend("sharded", {"LOCATION": own_redis.url(), "OPTIONS": {"SHARDS": 4}})
    try:
        yield backend
    finally:
        backend.close()


def test_a_cluster_page_reads_its_16_tags_in_one_round(
    unique: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 tags over 3 masters: one write per master, then the replies (before: 16 rounds,
    a script per tag after the last one's reply, about 10 ms a page)."""
    require_redis(cluster=True)
    backend = locks["redis-cluster"]
    assert isinstance(backend, RedisBackend) and backend.shards == 16
    prefix = unique("rounds") + "/"
    names = [f"{prefix}{i:02}" for i in range(30)]
    handles = [backend.lock(name, ttl=30) for name in names]
    for handle in handles:
        assert handle.acquire()
    try:
        backend.held_locks(prefix=prefix)  # the cluster's slots known, connections open
        rounds = Rounds(monkeypatch)
        page = backend.held_locks(prefix=prefix, limit=7)
        assert [info.name for info in page] == names[:7]
        assert rounds.take() == (1, 3)
        assert _all_pages(backend, prefix, 7) == [names[i : i + 7] for i in range(0, 30, 7)]
    finally:
        for handle in handles:
            handle.release()
    assert backend.held_locks(prefix=prefix).locks == []


def test_tags_on_one_server_are_one_round_and_a_flushed_script_is_loaded(
    sharded: RedisBackend, own_redis: Any, unique: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SHARDS on one server: one pipeline; after SCRIPT FLUSH (a restart, a failover)
    each tag's NOSCRIPT is run again with the script's text, the page unchanged."""
    prefix = unique("tags") + "/"
    names = [f"{prefix}{i:02}" for i in range(11)]
    handles = [sharded.lock(name, ttl=30) for name in names]
    for handle in handles:
        assert handle.acquire()
    assert len({sharded.keys_for(h.key).listing for h in handles}) == 4
    expected = [names[i : i + 3] for i in range(0, 11, 3)]
    assert _all_pages(sharded, prefix, 3) == expected
    rounds = Rounds(monkeypatch)
    assert [info.name for info in sharded.held_locks(prefix=prefix, limit=3)] == names[:3]
    assert rounds.take() == (1, 1)
    redis.Redis.from_url(own_redis.url()).script_flush()
    assert _all_pages(sharded, prefix, 3) == expected
    for handle in handles:
        handle.release()
    assert _all_pages(sharded, prefix, 3) == [[]]


def test_listing_off_picks_a_class_whose_flags_say_so() -> None:
    """``OPTIONS["LISTING"] = False`` takes listing and counting away, so it picks a
    subclass with those flags off (docs/architecture.md's rule, as the database backend's
    ``MODE`` does), never a change of the flags on one instance (no I/O here)."""
    where = {"LOCATION": "redis://127.0.0.1:1/0"}
    unlisted = RedisBackend("r", {**where, "OPTIONS": {"LISTING": False}})
    cls = type(unlisted)
    assert not cls.supports_listing and not cls.supports_counting
    assert cls is not RedisBackend and issubclass(cls, RedisBackend)
    assert not {"supports_listing", "supports_counting", "why_unsupported"} & vars(unlisted).keys()
    for flag in ("supports_listing", "supports_counting"):
        assert "OPTIONS['LISTING'] is False" in cls.why_unsupported[flag]
    with pytest.raises(UnsupportedOperation, match=re.escape("OPTIONS['LISTING'] is False")):
        unlisted.held_locks()
    with pytest.raises(UnsupportedOperation, match=re.escape("OPTIONS['LISTING'] is False")):
        unlisted.count_held()
    assert unlisted.listing is False and "i" not in unlisted.flags  # no index entry written
    assert backend_label(unlisted) == "Redis"  # as the admin names it
    listed = RedisBackend("r", {**where, "OPTIONS": {"LISTING": True}})
    assert type(listed) is RedisBackend and listed.listing and "i" in listed.flags
    assert type(cls("r", where)) is cls  # named directly: LISTING is False by default
    with pytest.raises(InvalidBackendOptions, match="LISTING"):
        cls("r", {**where, "OPTIONS": {"LISTING": True}})
