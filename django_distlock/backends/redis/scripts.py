"""The Lua scripts of the Redis backend: each lock operation is one ``EVALSHA``.

The keys of one lock (see :class:`~django_distlock.backends.redis.keys.Keys`)
share one hash tag, so a script never spans Redis Cluster slots:

- ``lock``: a string, the holder, ``PX`` = the lease: ``token count fencing acquired_ms meta``
  (the owner token is 32 hex digits; ``meta`` is ``host pid thread``, shown by listings);
- ``queue``: a sorted set of waiting owner tokens by arrival (microseconds), the fair queue;
- ``waiters``: a hash, owner token -> ``alive_until_ms kind target``: until when the
  waiter counts as alive, and how to wake it (``L`` = ``LPUSH`` a list it
  ``BLPOP``s, ``P`` = ``PUBLISH`` its token on a channel its process listens to);
  and owner token + ``:m`` -> the waiter's ``meta`` (shown by ``waiters()``; a reader's
  or permit's starts ``r@`` or ``s@``), set and deleted with its entry;
- ``index``: a sorted set of held names (score 0, in name order) for listings;
- ``seq``: the last fencing token of the tag; the next is the larger of it + 1 and the
  server's clock in microseconds, so tokens keep growing after a Redis restart with
  older state (no persistence, an older snapshot, a failover to a lagging replica).

Only the waiters' signal targets are not passed as ``KEYS``: they are read
from ``waiters`` and carry the same hash tag (built by the client).
"""

from __future__ import annotations

import hashlib

# Shared functions, prepended to the scripts that use them.
_NOW = """
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000), t[1] * 1000000 + t[2]
end
"""

# The first live waiter of the queue, dropping the dead ones met on the way (at most
# 100 per call: a script must stay short; the rest go at the next call).
_HEAD = """
local function forget(queue, waiters, h)
  redis.call('ZREM', queue, h)
  local e = redis.call('HGET', waiters, h)
  if e then
    redis.call('HDEL', waiters, h, h .. ':m')
    local s = string.find(e, ' ')
    if string.sub(e, s + 1, s + 1) == 'L' then redis.call('DEL', string.sub(e, s + 3)) end
  end
end
local function head(queue, waiters, now)
  for _ = 1, 100 do
    local h = redis.call('ZRANGE', queue, 0, 0)[1]
    if not h then return nil end
    now = now or now_ms()
    local e = redis.call('HGET', waiters, h)
    if e and tonumber(string.match(e, '^%d+')) > now then return h, e end
    forget(queue, waiters, h)
  end
  return nil
end
local function wake(h, e)
  local s = string.find(e, ' ')
  local kind, target = string.sub(e, s + 1, s + 1), string.sub(e, s + 3)
  if kind == 'L' then
    redis.call('LPUSH', target, '1')
    redis.call('PEXPIRE', target, 60000)
  else
    redis.call('PUBLISH', target, h)
  end
end
local function wake_head(queue, waiters)
  local h, e = head(queue, waiters, nil)
  if h then wake(h, e) end
end
"""

#: KEYS: lock, queue, waiters, seq, index.
#: ARGV: member (the stored name), alive_ms (how long a joined waiter counts as alive),
#: then per call: token, ttl_ms, meta, flags (``f`` fair, ``r`` reentrant, ``j`` join the
#: queue on a miss, ``q`` already queued, ``i`` enter the held name in the index),
#: signal (``L <list key>`` or ``P <channel>``), not_after (see below; optional).
#: Returns ``{1, fencing, acquired_ms, now_ms, count}`` on a grant, ``{0, retry_after_ms}``
#: on a miss (-1: unknown), ``{0, -2}`` when refused for running after ``not_after``.
#:
#: Server time is the budget (see docs/scale.md): each ``redis.call`` costs about a
#: microsecond, a ``ZRANGE`` several, a ``string.format`` one. The uncontended grant runs
#: ``TIME``, ``GET``, ``EXISTS`` (fair only), ``SET`` (fencing) and ``SET`` + ``ZADD``, and
#: builds its numbers from ``TIME``'s own digits; the queue's helpers are defined and
#: run only when the lock is held or somebody queues.
ACQUIRE = """
local lock, queue, waiters = KEYS[1], KEYS[2], KEYS[3]
local token, flags = ARGV[3], ARGV[6]
local t = redis.call('TIME')
local now, now_us = t[1] * 1000 + math.floor(t[2] / 1000), t[1] * 1000000 + t[2]
-- not_after: the server time (ms) until which the client still waits for this reply
-- (0 or absent: no limit). Run later (the server was frozen, the client gave up), the
-- attempt changes nothing: a grant now would go to an owner no handle holds.
local not_after = tonumber(ARGV[8] or 0)
if not_after > 0 and now > not_after then return {0, -2} end
local held = redis.call('GET', lock)
local fair = string.find(flags, 'f', 1, true)
if held or (fair and redis.call('EXISTS', queue) == 1) then
""" + _NOW + _HEAD + """
  local function join()
    if string.find(flags, 'j', 1, true) then
      redis.call('ZADD', queue, 'NX', now_us, token)
      redis.call('HSET', waiters, token,
        string.format('%.0f', now + tonumber(ARGV[2])) .. ' ' .. ARGV[7], token .. ':m', ARGV[5])
      local keep = tonumber(ARGV[2]) + 60000
      redis.call('PEXPIRE', queue, keep)
      redis.call('PEXPIRE', waiters, keep)
    end
  end
  if held then
    if string.sub(held, 1, 32) == token then
      -- Ours: a reentrant acquisition counts up; else a retried request of the same
      -- acquisition (its reply was lost) finds its own grant.
      local count, fencing, acquired, meta = string.match(held, '^ (%d+) (%d+) (%d+) (.*)', 33)
      if string.find(flags, 'r', 1, true) then
        count = count + 1
        redis.call('SET', lock, token .. ' ' .. count .. ' ' .. fencing .. ' ' .. acquired
          .. ' ' .. meta, 'PX', ARGV[4])
      end
      return {1, tonumber(fencing), tonumber(acquired), now, tonumber(count)}
    end
    join()
    return {0, redis.call('PTTL', lock)}
  end
  local h, e = head(queue, waiters, now)
  if h and h ~= token then
    join()
    return {0, tonumber(string.match(e, '^%d+')) - now}
  end
end
-- The token is the larger of the last one + 1 and the server's clock in microseconds:
-- a server back with older state (a snapshot, a lagging replica) still issues tokens
-- above every one it issued before, as long as its clock has moved on since. Its
-- digits are TIME's own (seconds, then microseconds padded to 6).
local frac = string.sub('00000' .. t[2], -6)
local digits, fencing = t[1] .. frac, now_us
local last = redis.call('SET', KEYS[4], digits, 'GET')
if last and tonumber(last) >= now_us then
  fencing = tonumber(last) + 1
  digits = string.format('%.0f', fencing)
  redis.call('SET', KEYS[4], digits)
end
redis.call('SET', lock, token .. ' 1 ' .. digits .. ' ' .. t[1] .. string.sub(frac, 1, 3)
  .. ' ' .. ARGV[5], 'PX', ARGV[4])
if string.find(flags, 'i', 1, true) then redis.call('ZADD', KEYS[5], 0, ARGV[1]) end
if string.find(flags, 'q', 1, true) then
  -- leave the queue: this waiter's entry, and its signal list if it has one
  redis.call('ZREM', queue, token)
  redis.call('HDEL', waiters, token, token .. ':m')
  if string.sub(ARGV[7], 1, 2) == 'L ' then redis.call('DEL', string.sub(ARGV[7], 3)) end
end
return {1, fencing, now, now, 1}
"""

#: KEYS: lock, queue, waiters, index. ARGV: member ('' for an alias without a listing
#: index: the index is left alone), token.
#: Returns 0 if not held by ``token``, 1 when freed (and the first live waiter woken),
#: 2 when a reentrant count went down by one. The queue is read only when it exists.
RELEASE = """
local held = redis.call('GET', KEYS[1])
if not held or string.sub(held, 1, 32) ~= ARGV[2] then return 0 end
if string.sub(held, 33, 35) ~= ' 1 ' then
  local count, rest = string.match(held, '^ (%d+) (.*)', 33)
  redis.call('SET', KEYS[1], ARGV[2] .. ' ' .. (count - 1) .. ' ' .. rest, 'KEEPTTL')
  return 2
end
redis.call('DEL', KEYS[1])
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[4], ARGV[1]) end
if redis.call('EXISTS', KEYS[2]) == 1 then
""" + _NOW + _HEAD + """
  wake_head(KEYS[2], KEYS[3])
end
return 1
"""

#: KEYS: lock. ARGV: token, ttl_ms.
#: Returns ``{fencing, acquired_ms, now_ms}``, or 0 if not held by ``token``.
EXTEND = (
    _NOW
    + """
local held = redis.call('GET', KEYS[1])
if not held or string.sub(held, 1, 32) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local fencing, acquired = string.match(held, '^ %d+ (%d+) (%d+)', 33)
return {tonumber(fencing), tonumber(acquired), (now_ms())}
"""
)

#: KEYS: lock, queue, waiters. ARGV: token.
#: A waiter leaves the queue; if the lock is free, the next live waiter is woken (it may
#: have been behind this one). Returns 1.
LEAVE = (
    _NOW
    + _HEAD
    + """
forget(KEYS[2], KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then wake_head(KEYS[2], KEYS[3]) end
return 1
"""
)

#: KEYS: lock, queue, waiters, index. ARGV: member, owner (a prefix of the holder's
#: token, '' for any holder).
#: Frees the lock if that owner holds it. Returns the fencing token freed, or 0 if not held
#: (by that owner).
FORCE_RELEASE = (
    _NOW
    + _HEAD
    + """
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 0
end
if string.sub(held, 1, #ARGV[2]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[4], ARGV[1])
wake_head(KEYS[2], KEYS[3])
return tonumber(string.match(held, '^ %d+ (%d+)', 33))
"""
)

#: KEYS: index. ARGV: base (the tag's key prefix), min, max (``ZRANGEBYLEX`` bounds),
#: limit, budget (most index entries to look at).
#: Returns a flat list ``member, holder, pttl_ms, waiters, ...`` of up to ``limit``
#: held locks, then the last member looked at (or '' when the range is exhausted);
#: entries of leases that ended are dropped from the index on the way.
LIST = """
local base, low, limit, budget = ARGV[1], ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])
local out, found, last = {}, 0, ''
while found < limit and budget > 0 do
  local batch = redis.call('ZRANGEBYLEX', KEYS[1], low, ARGV[3], 'LIMIT', 0,
    math.min(limit - found, budget))
  if #batch == 0 then
    last = ''
    break
  end
  for _, member in ipairs(batch) do
    local held = redis.call('GET', base .. 'l:' .. member)
    if held then
      out[#out + 1] = member
      out[#out + 1] = held
      out[#out + 1] = redis.call('PTTL', base .. 'l:' .. member)
      out[#out + 1] = redis.call('ZCARD', base .. 'q:' .. member)
      found = found + 1
    else
      redis.call('ZREM', KEYS[1], member)
    end
    last = member
  end
  budget = budget - #batch
  low = '(' .. last
end
out[#out + 1] = last
return out
"""

#: Counts one tag's held locks, read-only, a chunk at a time: KEYS[1] the tag's listing
#: index; ARGV: base, low, high, limit, chunk (most index entries this call reads: it
#: bounds how long the script holds the server), first (``1``: also count the range's
#: entries). Returns {held counted, 1 when the range was read to its end, the last member
#: read ('' if none), entries read, the range's index entries (held and ended leases
#: alike: a ceiling; first call only, else 0)}; it stops past ``limit`` held.
COUNT = """
local base, low, limit, chunk = ARGV[1], ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])
local found, read, done, last = 0, 0, 0, ''
while found <= limit and read < chunk do
  local batch = redis.call('ZRANGEBYLEX', KEYS[1], low, ARGV[3], 'LIMIT', 0,
    math.min(1000, chunk - read))
  if #batch == 0 then
    done = 1
    break
  end
  for _, member in ipairs(batch) do
    found = found + redis.call('EXISTS', base .. 'l:' .. member)
  end
  read = read + #batch
  last = batch[#batch]
  low = '(' .. last
end
local entries = 0
if ARGV[6] == '1' then entries = redis.call('ZLEXCOUNT', KEYS[1], ARGV[2], ARGV[3]) end
return {found, done, last, read, entries}
"""


class Script:
    """A script's text and SHA1 (what ``EVALSHA`` runs)."""

    __slots__ = ("name", "sha", "text")

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


SCRIPTS = {
    name: Script(name, text)
    for name, text in {
        "acquire": ACQUIRE,
        "release": RELEASE,
        "extend": EXTEND,
        "leave": LEAVE,
        "force_release": FORCE_RELEASE,
        "list": LIST,
        "count": COUNT,
    }.items()
}
