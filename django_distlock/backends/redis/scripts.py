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

Only the waiters' signal targets are not passed as ``KEYS``: they come in an
acquire's arguments or are read from ``waiters``, and carry the same hash tag (built
by the client).
"""

from __future__ import annotations

import hashlib

# Lua written once for several scripts, put into the text of each that uses it.
# The server's clock: ``t`` (TIME's reply), ``now`` (ms) and ``now_us``.
_TIME = """
local t = redis.call('TIME')
local now, now_us = t[1] * 1000 + math.floor(t[2] / 1000), t[1] * 1000000 + t[2]
"""

# The clock as a function, and how much longer (ms) the waiter of a queue entry
# ``alive_until_ms signal`` counts as alive (<= 0: it died or gave up).
_NOW = """
local function now_ms()
""" + _TIME + """
  return now
end
local function alive_for(e, now) return tonumber(string.match(e, '^%d+')) - now end
"""

# The fair queue's functions, on KEYS[2] (the queue) and KEYS[3] (the waiters' entries) of
# every script that uses them. An entry's signal is ``L <list>`` (the waiter ``BLPOP``s
# the list) or ``P <channel>`` (its process listens there for its token).
_QUEUE = _NOW + """
local queue, waiters = KEYS[2], KEYS[3]
local function signal(e) return e and string.sub(e, string.find(e, ' ') + 1) or '' end
-- join (NX: a waiter asking again keeps its place) or renew the entry, alive for
-- alive_ms more; the keys outlive the last entry by a minute
local function join(token, now, now_us, alive_ms, sig, meta)
  redis.call('ZADD', queue, 'NX', now_us, token)
  redis.call('HSET', waiters, token, string.format('%.0f ', now + alive_ms) .. sig,
    token .. ':m', meta)
  redis.call('PEXPIRE', queue, alive_ms + 60000)
  redis.call('PEXPIRE', waiters, alive_ms + 60000)
end
-- leave: the entry, and the waiter's signal list if it has one
local function leave(token, sig)
  redis.call('ZREM', queue, token)
  redis.call('HDEL', waiters, token, token .. ':m')
  if string.sub(sig, 1, 2) == 'L ' then redis.call('DEL', string.sub(sig, 3)) end
end
-- the first live waiter and its entry, dropping the dead ones met on the way (at most
-- 100 per call: a script must stay short; the rest go at the next call)
local function head(now)
  for _ = 1, 100 do
    local h = redis.call('ZRANGE', queue, 0, 0)[1]
    if not h then return nil end
    now = now or now_ms()
    local e = redis.call('HGET', waiters, h)
    if e and alive_for(e, now) > 0 then return h, e end
    leave(h, signal(e))
  end
  return nil
end
local function wake(h, e)
  local sig = signal(e)
  local target = string.sub(sig, 3)
  if string.sub(sig, 1, 1) == 'L' then
    redis.call('LPUSH', target, '1')
    redis.call('PEXPIRE', target, 60000)
  else
    redis.call('PUBLISH', target, h)
  end
end
local function wake_head()
  local h, e = head(nil)
  if h then wake(h, e) end
end
"""

# An acquire's start (ARGV[8] is not_after): the server's clock, and the refusal of an
# attempt run too late.
_START = _TIME + """
-- not_after: the server time (ms) until which the client still waits for this reply
-- (0 or absent: no limit). Run later (the server was frozen, the client gave up), the
-- attempt changes nothing: a grant now would go to an owner no handle holds.
local not_after = tonumber(ARGV[8] or 0)
if not_after > 0 and now > not_after then return {0, -2} end
"""

# A grant's fencing token (KEYS[4] is seq): the larger of the last one + 1 and the
# server's clock in microseconds, so a server back with older state (a snapshot, a
# lagging replica) still issues tokens above every one it issued before, as long as its
# clock has moved on since. ``digits`` are the token's, ``ms`` the grant time's: TIME's
# own digits (seconds, then microseconds padded to 6), no ``string.format``.
_NEXT_TOKEN = """
local frac = string.sub('00000' .. t[2], -6)
local digits, fencing, ms = t[1] .. frac, now_us, t[1] .. string.sub(frac, 1, 3)
local last = redis.call('SET', KEYS[4], digits, 'GET')
if last and tonumber(last) >= now_us then
  fencing = tonumber(last) + 1
  digits = string.format('%.0f', fencing)
  redis.call('SET', KEYS[4], digits)
end
"""

#: KEYS: lock, queue, waiters, seq, index.
#: ARGV: member (the stored name), alive_ms (how long a joined waiter counts as alive),
#: then per call: token, ttl_ms, meta, flags (``f`` fair, ``r`` reentrant, ``j`` join the
#: queue on a miss, ``q`` already queued, ``i`` enter the held name in the index),
#: signal (``L <list key>`` or ``P <channel>``), not_after (see ``_START``; optional).
#: Returns ``{1, fencing, acquired_ms, now_ms, count}`` on a grant, ``{0, retry_after_ms}``
#: on a miss (-1: unknown), ``{0, -2}`` when refused for running after ``not_after``.
#:
#: Server time is the budget (see docs/scale.md): each ``redis.call`` costs about a
#: microsecond, a ``ZRANGE`` several, a ``string.format`` one. The uncontended grant runs
#: ``TIME``, ``GET``, ``EXISTS`` (fair only), ``SET`` (fencing) and ``SET`` + ``ZADD``, and
#: builds its numbers from ``TIME``'s own digits; the queue's functions are defined and
#: run only when the lock is held, somebody queues or the caller was queued.
ACQUIRE = """
local lock, token, flags = KEYS[1], ARGV[3], ARGV[6]
""" + _START + """
local held = redis.call('GET', lock)
local fair, queued = string.find(flags, 'f', 1, true), string.find(flags, 'q', 1, true)
local quit  -- a queued caller's leave(), to leave the queue once granted
if held or queued or (fair and redis.call('EXISTS', KEYS[2]) == 1) then
""" + _QUEUE + """
  local function miss(wait)
    if string.find(flags, 'j', 1, true) then join(token, now, now_us, ARGV[2], ARGV[7], ARGV[5]) end
    return {0, wait}
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
    return miss(redis.call('PTTL', lock))
  end
  if fair then
    local h, e = head(now)
    if h and h ~= token then return miss(alive_for(e, now)) end
  end
  if queued then quit = leave end
end
""" + _NEXT_TOKEN + """
redis.call('SET', lock, token .. ' 1 ' .. digits .. ' ' .. ms .. ' ' .. ARGV[5], 'PX', ARGV[4])
if string.find(flags, 'i', 1, true) then redis.call('ZADD', KEYS[5], 0, ARGV[1]) end
if quit then quit(token, ARGV[7]) end
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
""" + _QUEUE + """
  wake_head()
end
return 1
"""

#: KEYS: lock. ARGV: token, ttl_ms.
#: Returns ``{fencing, acquired_ms, now_ms}``, or 0 if not held by ``token``.
EXTEND = """
local held = redis.call('GET', KEYS[1])
if not held or string.sub(held, 1, 32) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
""" + _TIME + """
local fencing, acquired = string.match(held, '^ %d+ (%d+) (%d+)', 33)
return {tonumber(fencing), tonumber(acquired), now}
"""

#: KEYS: lock, queue, waiters. ARGV: token.
#: A waiter leaves the queue; if the lock is free, the next live waiter is woken (it may
#: have been behind this one). Returns 1.
LEAVE = _QUEUE + """
leave(ARGV[1], signal(redis.call('HGET', waiters, ARGV[1])))
if redis.call('EXISTS', KEYS[1]) == 0 then wake_head() end
return 1
"""

# A force release of the exclusive holder ``held`` (KEYS: lock, queue, waiters, index;
# ARGV: member, owner): the fencing token freed, or 0 if another owner holds it.
_FORCE_EXCLUSIVE = """
if string.sub(held, 1, #ARGV[2]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[4], ARGV[1])
wake_head()
return tonumber(string.match(held, '^ %d+ (%d+)', 33))
"""

#: KEYS: lock, queue, waiters, index. ARGV: member, owner (a prefix of the holder's
#: token, '' for any holder).
#: Frees the lock if that owner holds it. Returns the fencing token freed, or 0 if not held
#: (by that owner).
FORCE_RELEASE = _QUEUE + """
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 0
end
""" + _FORCE_EXCLUSIVE

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
