"""The Lua scripts behind the proxy's Redis store (a global rate limit and budgets
across proxy replicas; SPEC: the proxy's exact rate limit and query budgets, IEEE-M6 Q_m).

Each script runs atomically in Redis (``EVALSHA``; loaded once per server, again after a
restart empties the script cache), so proxy replicas sharing one Redis never interleave a
check with another replica's charge. Times are integer microseconds of Redis ``TIME``: the
one clock of every replica. Numbers are written with ``string.format`` because Lua's default
``tostring`` keeps only 14 digits (a microsecond timestamp has 16).

Why our own scripts rather than the ``limits`` library: its moving window counts grants in a
window measured on each *client's* clock, checks one key per call and cannot say how long
to wait, whereas the guarantee of ``ratelimit.py`` needs the exact grant log over a closed
window of ``window_s + jitter_s`` plus GCRA pacing, checked and taken on the target's and
the tenant's limiter together (all-or-nothing), on one clock, with the wait returned so
the fair queue can sleep instead of polling.
"""

from __future__ import annotations

#: ``ratelimit._try_grant`` for limiters kept in Redis.
#: KEYS: per limiter i: KEYS[2i-1] its state (hash: tat, in_span, last), KEYS[2i] its grant
#: log (list of "time_us images", oldest first). ARGV: n, m, then per limiter: limit,
#: span_us, interval_us, tau_us; then, only in the tests' simulations, a fake now_us (in
#: production the clock is Redis TIME). Limiter 1 is the shared one (the target's).
#: Returns {shared_wait_us, own_wait_us, now_us}; both waits 0: granted and taken on all.
GRANT = """
local n = tonumber(ARGV[1])
local m = tonumber(ARGV[2])
local now = tonumber(ARGV[3 + 4 * m])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local st = {}
for i = 1, m do
  local h = redis.call('HMGET', KEYS[2 * i - 1], 'tat', 'in_span', 'last')
  local last = tonumber(h[3])
  if last and last > now then now = last end   -- one clock that never steps back
  st[i] = {tonumber(h[1]), tonumber(h[2]) or 0}
end
local shared_wait, own_wait = 0, 0
for i = 1, m do
  local b = 2 + (i - 1) * 4
  local limit, span = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local interval, tau = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local log = KEYS[2 * i]
  local tat, in_span = st[i][1], st[i][2]
  -- forget grants that left the closed window [now - span, now]
  local horizon = now - span
  local popped = false
  while true do
    local head = redis.call('LINDEX', log, 0)
    if not head then in_span = 0; break end
    local sp = string.find(head, ' ', 1, true)
    if tonumber(string.sub(head, 1, sp - 1)) >= horizon then break end
    in_span = in_span - tonumber(string.sub(head, sp + 1))
    redis.call('LPOP', log)
    popped = true
  end
  if popped then
    redis.call('HSET', KEYS[2 * i - 1], 'in_span', string.format('%d', in_span))
  end
  local wait = 0
  if tat then wait = math.max(wait, tat - tau - now) end     -- GCRA pacing
  local excess = in_span + n - limit                        -- the exact log
  if excess > 0 then
    local freed = 0
    for _, e in ipairs(redis.call('LRANGE', log, 0, -1)) do
      local sp = string.find(e, ' ', 1, true)
      freed = freed + tonumber(string.sub(e, sp + 1))
      if freed >= excess then
        wait = math.max(wait, tonumber(string.sub(e, 1, sp - 1)) + span - now + 1)
        break
      end
    end
  end
  st[i][2] = in_span
  st[i][3] = {interval, tau, span}
  if i == 1 then shared_wait = wait elseif wait > own_wait then own_wait = wait end
end
local stamp = string.format('%.0f', now)
if shared_wait > 0 or own_wait > 0 then
  return {math.ceil(shared_wait), math.ceil(own_wait), stamp}
end
for i = 1, m do
  local interval, tau, span = st[i][3][1], st[i][3][2], st[i][3][3]
  local tat = st[i][1]
  if not tat or tat < now then tat = now end
  tat = tat + n * interval
  redis.call('RPUSH', KEYS[2 * i], stamp .. ' ' .. string.format('%d', n))
  redis.call('HSET', KEYS[2 * i - 1], 'tat', string.format('%.3f', tat),
             'in_span', string.format('%d', st[i][2] + n), 'last', stamp)
  -- idle keys expire: once the log's window and the schedule have passed, nothing remains
  local ttl = math.ceil(math.max(span, tat - now + tau) / 1000) + 1000
  redis.call('PEXPIRE', KEYS[2 * i - 1], ttl)
  redis.call('PEXPIRE', KEYS[2 * i], ttl)
end
return {0, 0, stamp}
"""

#: Check-and-charge of a session's budgets (``query_budget`` and per-image Q_m).
#: KEYS[1]: the session's hash (field 't' every attempt, 'i:<image id>' per image).
#: ARGV: query_budget, per_image_budget, ttl_ms, n, m, init, id_1, k_1, .., id_m, k_m, then
#: when init = 1: init_total, j, iid_1, ic_1, .., iid_j, ic_j (the ledger's counts).
#: Returns {status, total, used_1, .., used_m}: 1 charged (counts after), 0 refused (counts
#: before, nothing charged), -1 the key is missing (call again with init = 1).
CHARGE = """
local key = KEYS[1]
local qb, pb, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n, m, init = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('EXISTS', key) == 0 then
  if init == 0 then return {-1} end
  local base = 7 + 2 * m
  redis.call('HSET', key, 't', ARGV[base])
  for i = 1, tonumber(ARGV[base + 1]) do
    redis.call('HSET', key, 'i:' .. ARGV[base + 2 * i], ARGV[base + 2 * i + 1])
  end
end
local total = tonumber(redis.call('HGET', key, 't')) or 0
local used = {}
local ok = not (qb > 0 and total + n > qb)
for i = 1, m do
  used[i] = tonumber(redis.call('HGET', key, 'i:' .. ARGV[5 + 2 * i])) or 0
  if pb > 0 and used[i] + tonumber(ARGV[6 + 2 * i]) > pb then ok = false end
end
if not ok then
  local out = {0, total}
  for i = 1, m do out[#out + 1] = used[i] end
  return out
end
local out = {1, redis.call('HINCRBY', key, 't', n)}
for i = 1, m do
  out[#out + 1] = redis.call('HINCRBY', key, 'i:' .. ARGV[5 + 2 * i], tonumber(ARGV[6 + 2 * i]))
end
redis.call('PEXPIRE', key, ttl)
return out
"""

#: Give back what a call charged and never sent. KEYS[1] the session's hash; ARGV: n, m,
#: id_1, k_1, ..; no key (expired, or Redis restarted): nothing to give back (the next
#: charge starts again from the ledger, which never counts rows not sent). Returns 1/0.
REFUND = """
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then return 0 end
local function down(field, k)
  local v = redis.call('HINCRBY', key, field, -k)
  if v < 0 then redis.call('HSET', key, field, 0) end
end
down('t', tonumber(ARGV[1]))
for i = 1, tonumber(ARGV[2]) do down('i:' .. ARGV[1 + 2 * i], tonumber(ARGV[2 + 2 * i])) end
return 1
"""

#: A tenant's queries of one UTC day. KEYS[1]: the day's count; ARGV: limit, n, ttl_ms,
#: init, init_count. Returns {status, count}: 1 charged (after), 0 refused (before),
#: -1 missing (call again with init = 1 and the ledger's count of the day).
DAY_CHARGE = """
local v = redis.call('GET', KEYS[1])
local used
if v then used = tonumber(v) else
  if tonumber(ARGV[4]) == 0 then return {-1} end
  used = tonumber(ARGV[5])
end
local limit, n = tonumber(ARGV[1]), tonumber(ARGV[2])
if limit > 0 and used + n > limit then
  if not v then redis.call('SET', KEYS[1], string.format('%d', used), 'PX', ARGV[3]) end
  return {0, used}
end
redis.call('SET', KEYS[1], string.format('%d', used + n), 'PX', ARGV[3])
return {1, used + n}
"""

#: Give back ``n`` of a day's count (never below 0). KEYS[1] the day's count; ARGV: n.
DAY_REFUND = """
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local left = math.max(0, tonumber(v) - tonumber(ARGV[1]))
redis.call('SET', KEYS[1], string.format('%d', left), 'KEEPTTL')
return 1
"""
