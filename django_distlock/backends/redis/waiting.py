"""Who waits for a Redis lock: one script reads the fair queue (see :mod:`.scripts`).

The queue (a sorted set of owner tokens by arrival, in microseconds of the server's
clock) gives the order and the arrival; the waiters hash gives whether the waiter is
still alive (``alive_until_ms kind target``) and who it is (``token:m`` -> the
holder field it would be granted with: ``host pid thread``, after ``w@``, ``r@`` or
``s@`` for a writer, a reader or a permit).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ...values import WaiterInfo, short_owner
from .kinds import WRITER
from .scripts import _NOW, Script

if TYPE_CHECKING:
    from .backend import RedisBackend

#: KEYS: queue, waiters. ARGV: limit. Returns ``token, arrived_us, meta`` of the first
#: ``limit`` queue entries whose waiter is still alive (a waiter that gave up without
#: leaving is dropped by the next acquire's walk of the queue, and not shown here).
WAITERS = Script(
    "waiters",
    _NOW + """
local now = now_ms()
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local out = {}
for i = 1, #ids, 2 do
  local e = redis.call('HMGET', KEYS[2], ids[i], ids[i] .. ':m')
  if e[1] and alive_for(e[1], now) > 0 then
    out[#out + 1] = ids[i]
    out[#out + 1] = ids[i + 1]
    out[#out + 1] = e[2] or ''
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
    for i in range(0, len(flat), 3):
        token, arrived, meta = (_text(v) for v in flat[i : i + 3])
        kind = _KINDS.get(meta[:2], "exclusive")
        if meta[:2] in _KINDS:
            meta = meta[2:]
        host, pid, thread = [*meta.split(" ", 2), "", "", ""][:3]
        found.append(
            WaiterInfo(
                position=i // 3 + 1,
                owner=short_owner(token),
                since=datetime.fromtimestamp(float(arrived) / 1e6, UTC),
                host=host,
                pid=int(pid) if pid.isdigit() else None,
                thread=thread,
                kind=kind if meta else "",
            )
        )
    return found


#: What a waiter's stored holder field starts with, by kind (none: exclusive).
_KINDS = {WRITER: "write", "r@": "read", "s@": "semaphore"}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
