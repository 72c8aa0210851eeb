"""Who waits for a Redis lock: one script reads the fair queue (see :mod:`.scripts`).

The queue (a sorted set of owner tokens by arrival, in microseconds of the server's
clock) and the waiters hash (token -> ``alive_until_ms kind target``) are all Redis
keeps of a waiter: its owner token and when it arrived, not its host, process or
thread (storing them would lengthen every miss's script for a page few open).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ...values import WaiterInfo, short_owner
from .scripts import Script

if TYPE_CHECKING:
    from .backend import RedisBackend

#: KEYS: queue, waiters. ARGV: limit. Returns ``token, arrived_us`` pairs of the first
#: ``limit`` queue entries whose waiter is still alive (a waiter that gave up without
#: leaving is dropped by the next acquire's walk of the queue, and not shown here).
WAITERS = Script(
    "waiters",
    """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local out = {}
for i = 1, #ids, 2 do
  local e = redis.call('HGET', KEYS[2], ids[i])
  if e and tonumber(string.match(e, '^%d+')) > now then
    out[#out + 1] = ids[i]
    out[#out + 1] = ids[i + 1]
  end
end
return out
""",
)


def read_waiters(backend: RedisBackend, key: str, limit: int) -> list[WaiterInfo]:
    """The live waiters of the lock with storage key ``key``, first in line first.

    :param backend: the Redis backend (one server or a cluster: the keys share a tag).
    :param key: the lock's storage key.
    :param limit: the most queue entries read.
    :returns: the waiters.
    :raises BackendUnavailable: when Redis fails.
    """
    keys = backend.keys_for(key)
    flat = backend.redis.run(WAITERS, (keys.queue, keys.waiters), (limit,))
    found = []
    for i in range(0, len(flat), 2):
        token = flat[i].decode() if isinstance(flat[i], bytes) else flat[i]
        arrived = float(flat[i + 1])
        found.append(
            WaiterInfo(
                position=i // 2 + 1,
                owner=short_owner(token),
                since=datetime.fromtimestamp(arrived / 1e6, UTC),
            )
        )
    return found
