"""The Lua scripts of Redis read-write locks and semaphores: each step one ``EVALSHA``.

A read lock's readers and a semaphore's permits are *shares*: many owners hold the
name at once, each with a lease of its own. Besides the exclusive lock's keys (see
:mod:`.scripts`; all of one hash tag) a name held in shares has:

- ``holders``: a sorted set, owner token -> the end of its lease (server ms). A
  share whose score has passed has ended: the scripts drop it (``prune``) whenever
  they run, on the server's clock (``TIME``);
- ``data``: a hash, owner token -> ``fencing acquired_ms host pid thread``.

The ``lock`` string then holds a *marker*, ``rrr…r 0`` (readers) or ``sss…s <limit>``
(a semaphore and its stored limit; 32 letters that no owner token, 32 hex digits,
equals), with ``PX`` = the end of the last share (+1 ms). So the exclusive lock's
scripts see the name held (a writer, which is an exclusive lock, waits for the last
reader), ``EXISTS`` tells whether anything holds it, and the listing index is shared.

Waiters share the exclusive lock's fair queue: a reader or a permit that arrives
while someone waits queues behind (a writer is not starved by later readers); a
share granted to the queue's head wakes the next waiter (readers behind readers, or
a permit left), so a writer's release lets the whole run of readers behind it in.
"""

from __future__ import annotations

from .scripts import _FORCE_EXCLUSIVE, _NEXT_TOKEN, _NOW, _QUEUE, _START, Script

#: The acquire script's reply (after a 0) when the stored semaphore limit differs.
LIMIT_MISMATCH = -3

_SHARES = """
local READ, SEM = string.rep('r', 32) .. ' ', string.rep('s', 32) .. ' '
local function shared(held)
  local t = string.sub(held or '', 1, 33)
  return t == READ or t == SEM
end
-- drop shares whose lease ended (at most 100 per call: the rest at the next one)
local function prune(holders, data, now)
  for _, t in ipairs(redis.call('ZRANGEBYSCORE', holders, '-inf', now, 'LIMIT', 0, 100)) do
    redis.call('ZREM', holders, t)
    redis.call('HDEL', data, t)
  end
end
-- keep the marker (and the share keys) until the last share ends; false when none is left
local function cover(lock, holders, data, now, marker)
  local top = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')[2]
  if not top or tonumber(top) <= now then
    redis.call('DEL', lock, holders, data)
    return false
  end
  local ms = string.format('%.0f', tonumber(top) - now + 1)
  if marker then redis.call('SET', lock, marker, 'PX', ms) else redis.call('PEXPIRE', lock, ms) end
  redis.call('PEXPIRE', holders, ms)
  redis.call('PEXPIRE', data, ms)
  return true
end
"""
_PRELUDE = _QUEUE + _SHARES

#: KEYS: lock, queue, waiters, seq, index, holders, data.
#: ARGV: member, alive_ms, then per call: token, ttl_ms, meta, flags (as the exclusive
#: acquire's), signal, not_after, limit (0: a read lock, any number of readers).
#: Returns ``{1, fencing, acquired_ms, now_ms, 1}`` on a grant, ``{0, retry_after_ms}``
#: on a miss, ``{0, -2}`` when run after ``not_after``, ``{0, -3, stored_limit}`` when
#: the semaphore's stored limit is another.
ACQUIRE = _PRELUDE + """
local lock, holders, data = KEYS[1], KEYS[6], KEYS[7]
local token, flags, limit = ARGV[3], ARGV[6], tonumber(ARGV[9])
""" + _START + """
local marker = (limit == 0 and READ or SEM) .. limit
local function miss(wait)
  if string.find(flags, 'j', 1, true) then
    join(token, now, now_us, ARGV[2], ARGV[7], (limit == 0 and 'r@' or 's@') .. ARGV[5])
  end
  return {0, wait}
end
local held = redis.call('GET', lock)
if held and held ~= marker then
  if limit > 0 and string.sub(held, 1, 33) == SEM then
    return {0, -3, tonumber(string.sub(held, 34))}
  end
  return miss(redis.call('PTTL', lock))  -- a writer (an exclusive holder), or other shares
end
prune(holders, data, now)
local mine = redis.call('HGET', data, token)
if mine and tonumber(redis.call('ZSCORE', holders, token) or 0) > now then
  -- a retried request of this acquisition (its reply was lost) finds its own grant
  local f, a = string.match(mine, '^(%d+) (%d+)')
  return {1, tonumber(f), tonumber(a), now, 1}
end
local live = redis.call('ZCOUNT', holders, '(' .. now, '+inf')
if limit > 0 and live >= limit then
  local first = redis.call('ZRANGEBYSCORE', holders, '(' .. now, '+inf', 'WITHSCORES',
    'LIMIT', 0, 1)[2]
  return miss(tonumber(first) - now)
end
if string.find(flags, 'f', 1, true) then
  local h, e = head(now)
  if h and h ~= token then return miss(alive_for(e, now)) end
end
-- every grant takes the tag's next fencing token, as an exclusive grant does
""" + _NEXT_TOKEN + """
redis.call('ZADD', holders, string.format('%.0f', now + tonumber(ARGV[4])), token)
redis.call('HSET', data, token, digits .. ' ' .. ms .. ' ' .. ARGV[5])
cover(lock, holders, data, now, marker)
if string.find(flags, 'i', 1, true) then redis.call('ZADD', KEYS[5], 0, ARGV[1]) end
if string.find(flags, 'q', 1, true) then
  leave(token, ARGV[7])
  -- let the next waiter in as well: a reader behind this one, or a permit left
  if limit == 0 or live + 1 < limit then wake_head() end
end
return {1, fencing, now, now, 1}
"""

#: KEYS: lock, queue, waiters, index, holders, data. ARGV: member, token.
#: Returns 1 when the share was held and is freed, 0 when it was not (or had ended).
#: The last share's release frees the name and wakes the first waiter; a permit's
#: release wakes it too (a permit came back).
RELEASE = _PRELUDE + """
local lock, holders, data, token = KEYS[1], KEYS[5], KEYS[6], ARGV[2]
local held = redis.call('GET', lock)
local score = redis.call('ZSCORE', holders, token)
redis.call('ZREM', holders, token)
redis.call('HDEL', data, token)
if not shared(held) then return 0 end
local now = now_ms()
prune(holders, data, now)
if not cover(lock, holders, data, now, nil) then
  redis.call('ZREM', KEYS[4], ARGV[1])
  wake_head()
elseif string.sub(held, 1, 33) == SEM then
  wake_head()
end
if score and tonumber(score) > now then return 1 end
return 0
"""

#: KEYS: lock, holders, data. ARGV: token, ttl_ms.
#: Returns ``{fencing, acquired_ms, now_ms}``, or 0 if ``token`` holds no share now.
EXTEND = _NOW + _SHARES + """
if not shared(redis.call('GET', KEYS[1])) then return 0 end
local now = now_ms()
local score, mine = redis.call('ZSCORE', KEYS[2], ARGV[1]), redis.call('HGET', KEYS[3], ARGV[1])
if not score or not mine or tonumber(score) <= now then return 0 end
redis.call('ZADD', KEYS[2], 'XX', string.format('%.0f', now + tonumber(ARGV[2])), ARGV[1])
cover(KEYS[1], KEYS[2], KEYS[3], now, nil)
local f, a = string.match(mine, '^(%d+) (%d+)')
return {tonumber(f), tonumber(a), now}
"""

#: KEYS: lock, queue, waiters. ARGV: token.
#: A waiter leaves the queue; if the name is free or held in shares, the next live waiter
#: is woken (it may get in now that this one is not ahead of it). Returns 1.
LEAVE = _PRELUDE + """
leave(ARGV[1], signal(redis.call('HGET', waiters, ARGV[1])))
local held = redis.call('GET', KEYS[1])
if not held or shared(held) then wake_head() end
return 1
"""

#: KEYS: lock, queue, waiters, index, holders, data. ARGV: member, owner (a prefix of
#: owner tokens, '' for every holder).
#: Frees the exclusive holder (a writer) or the matching shares. Returns the largest
#: fencing token freed, or 0 if nothing matched.
FORCE_RELEASE = _PRELUDE + """
local lock, holders, data, owner = KEYS[1], KEYS[5], KEYS[6], ARGV[2]
local held = redis.call('GET', lock)
if not held then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('DEL', holders, data)
  return 0
end
if not shared(held) then
""" + _FORCE_EXCLUSIVE + """
end
local freed = 0
for _, t in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
  if string.sub(t, 1, #owner) == owner then
    local f = tonumber(string.match(redis.call('HGET', data, t) or '1', '^%d+'))
    freed = math.max(freed, f)
    redis.call('ZREM', holders, t)
    redis.call('HDEL', data, t)
  end
end
if freed == 0 then return 0 end
local now = now_ms()
prune(holders, data, now)
if not cover(lock, holders, data, now, nil) then redis.call('ZREM', KEYS[4], ARGV[1]) end
wake_head()
return freed
"""

#: KEYS: holders, data. ARGV: limit.
#: Returns a flat list ``token, pttl_ms, data, ...`` of up to ``limit`` live shares,
#: the first to end first.
SHARES = _NOW + """
local now = now_ms()
local out = {}
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[1]))
for i = 1, #found, 2 do
  local d = redis.call('HGET', KEYS[2], found[i])
  if d then
    out[#out + 1] = found[i]
    out[#out + 1] = tonumber(found[i + 1]) - now
    out[#out + 1] = d
  end
end
return out
"""

_TEXTS = {"acquire": ACQUIRE, "release": RELEASE, "extend": EXTEND, "leave": LEAVE,
          "force_release": FORCE_RELEASE, "shares": SHARES}
KIND_SCRIPTS = {name: Script(f"kinds_{name}", text) for name, text in _TEXTS.items()}
