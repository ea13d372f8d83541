"""The Lua scripts of the Redis limits store (redis_store.py): one reservation and one settlement, each atomic,
with Redis's own clock, over keys that share one hash tag. `PERIODS` is the budget periods' part, shared with
the tests that check a budget's day and month boundaries.
"""

PERIODS = """
-- the UTC day and calendar month of Redis's clock (H. Hinnant's civil-date algorithms), and their ends
local day = math.floor(secs / 86400)
local function civil(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end
local function first_day(y, m)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5)
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end
local y, m = civil(day)
local month = y * 12 + m - 1
local ny, nm = y, m + 1
if nm > 12 then ny, nm = y + 1, 1 end
local ends = {(day + 1) * 86400000, first_day(ny, nm) * 86400000}
local ids = {'d' .. day, 'm' .. month}
"""

RESERVE = (
    """
local t = redis.call('TIME')
local secs = tonumber(t[1])
local now = secs * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid, tokens, window, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local horizon = now - window
local kind, retry = 0, 0
local rq, tq, bt, bc = {-1, -1, -1}, {-1, -1, -1}, {-1, -1, -1}, {-1, -1, -1}
local function oldest_reset(k)
  local o = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if #o > 0 then return tonumber(o[2]) + window - now end
  return 0
end
"""
    + PERIODS
    + """
-- budgets first: a spent budget refuses whatever the windows say (its wait, the period's end, is longer)
local bkind, bretry, bi, bused = 0, 0, -1, 0
-- a reservation that may shrink to fit (`Shrink`): the prompt, choices, the prompt's cost, an output token's
local sa = 6 + n * 7
local sprompt, schoices = tonumber(ARGV[sa]), tonumber(ARGV[sa + 1])
local spcost, sunit = tonumber(ARGV[sa + 2]), tonumber(ARGV[sa + 3])
local room_t, room_c = nil, nil
for i = 0, n - 1 do
  local a = 6 + i * 7
  local btok, bcost, per = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]) + 1
  if btok >= 0 or bcost >= 0 then
    local bk, pid = KEYS[i * 6 + 6], ids[per]
    if btok >= 0 then
      local left = btok - tonumber(redis.call('HGET', bk, 't' .. pid) or '0')
      if room_t == nil or left < room_t then room_t = left end
    end
    if bcost >= 0 then
      local left = bcost - tonumber(redis.call('HGET', bk, 'c' .. pid) or '0')
      if room_c == nil or left < room_c then room_c = left end
    end
  end
end
local btokens, bcosts = tokens, cost  -- what the budgets are checked against
if sprompt >= 0 and (room_t ~= nil or room_c ~= nil) then
  local asked = tokens - sprompt
  local c = asked
  if room_t ~= nil and room_t - sprompt < c then c = room_t - sprompt end
  if room_c ~= nil then
    local left = room_c - spcost
    if left < 0 then c = -1
    elseif sunit > 0 and math.floor(left / sunit) < c then c = math.floor(left / sunit) end
  end
  if c > 0 then c = c - (c % schoices) end
  local least = math.min(asked, schoices)
  if c >= least then
    if c < asked then
      tokens = sprompt + c
      cost = math.min(cost, spcost + math.ceil(c * sunit))
    end
    btokens, bcosts = tokens, cost
  else
    btokens, bcosts = sprompt + least, spcost + math.ceil(least * sunit)
  end
end
for i = 0, n - 1 do
  local a = 6 + i * 7
  local btok, bcost, per = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]) + 1
  if btok >= 0 or bcost >= 0 then
    local bk, pid, reset = KEYS[i * 6 + 6], ids[per], ends[per] - now
    if btok >= 0 then
      local used = tonumber(redis.call('HGET', bk, 't' .. pid) or '0')
      if bkind == 0 and used + btokens > btok then bkind = 4; bretry = reset; bi = i; bused = used end
      if bt[1] < 0 then bt = {btok, btok - used, reset} end
    end
    if bcost >= 0 then
      local used = tonumber(redis.call('HGET', bk, 'c' .. pid) or '0')
      if bkind == 0 and used + bcosts > bcost then bkind = 5; bretry = reset; bi = i; bused = used end
      if bc[1] < 0 then bc = {bcost, bcost - used, reset} end
    end
  end
end
for i = 0, n - 1 do
  local a = 6 + i * 7
  local rpm, tpm, conc = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local rk, tk, tw, ts, ck = KEYS[i * 6 + 1], KEYS[i * 6 + 2], KEYS[i * 6 + 3], KEYS[i * 6 + 4], KEYS[i * 6 + 5]
  if rpm >= 0 then
    redis.call('ZREMRANGEBYSCORE', rk, '-inf', horizon)
    local count = redis.call('ZCARD', rk)
    local reset = oldest_reset(rk)
    if kind == 0 and count + 1 > rpm then kind = 1; retry = reset end
    if rq[1] < 0 then rq = {rpm, rpm - count, reset} end
  end
  if tpm >= 0 then
    local old = redis.call('ZRANGEBYSCORE', tk, '-inf', horizon)
    if #old > 0 then
      local ws = redis.call('HMGET', tw, unpack(old))
      local sum = 0
      for j = 1, #ws do sum = sum + (tonumber(ws[j]) or 0) end
      redis.call('HDEL', tw, unpack(old))
      redis.call('ZREMRANGEBYSCORE', tk, '-inf', horizon)
      redis.call('DECRBY', ts, sum)
    end
    local total = tonumber(redis.call('GET', ts) or '0')
    local reset = oldest_reset(tk)
    if kind == 0 and total + tokens > tpm then
      kind = 2
      if tokens > tpm then
        retry = window
      else
        retry = reset
        local free = tpm - total
        local es = redis.call('ZRANGE', tk, 0, -1, 'WITHSCORES')
        for j = 1, #es, 2 do
          free = free + (tonumber(redis.call('HGET', tw, es[j])) or 0)
          if free >= tokens then retry = tonumber(es[j + 1]) + window - now; break end
        end
      end
    end
    if tq[1] < 0 then tq = {tpm, tpm - total, reset} end
  end
  if conc >= 0 then
    redis.call('ZREMRANGEBYSCORE', ck, '-inf', now)
    if kind == 0 and redis.call('ZCARD', ck) + 1 > conc then kind = 3; retry = 1000 end
  end
end
if bkind ~= 0 then kind = bkind; retry = bretry end
local tail = {rq[1], rq[2], rq[3], tq[1], tq[2], tq[3], bt[1], bt[2], bt[3], bc[1], bc[2], bc[3], day, month, bi, bused,
  tokens, cost, btokens, bcosts}
if kind ~= 0 then return {0, kind, retry, unpack(tail)} end
for i = 0, n - 1 do
  local a = 6 + i * 7
  local rpm, tpm, conc, lease = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local btok, bcost, per = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]) + 1
  local rk, tk, tw, ts, ck = KEYS[i * 6 + 1], KEYS[i * 6 + 2], KEYS[i * 6 + 3], KEYS[i * 6 + 4], KEYS[i * 6 + 5]
  if rpm >= 0 then
    redis.call('ZADD', rk, now, rid)
    redis.call('PEXPIRE', rk, window * 2)
  end
  if tpm >= 0 then
    redis.call('ZADD', tk, now, rid)
    redis.call('HSET', tw, rid, tokens)
    redis.call('INCRBY', ts, tokens)
    redis.call('PEXPIRE', tk, window * 2)
    redis.call('PEXPIRE', tw, window * 2)
    redis.call('PEXPIRE', ts, window * 2)
  end
  if conc >= 0 then
    redis.call('ZADD', ck, now + lease, rid)
    redis.call('PEXPIRE', ck, lease + window)
  end
  if btok >= 0 or bcost >= 0 then
    local bk, pid = KEYS[i * 6 + 6], ids[per]
    local cur = redis.call('HGET', bk, 'cur')
    if cur ~= pid then -- the first charge of a new period: drop the counters of all periods but the last
      for _, f in ipairs(redis.call('HKEYS', bk)) do
        local fp = string.sub(f, 2)
        if f ~= 'cur' and fp ~= pid and fp ~= cur then redis.call('HDEL', bk, f) end
      end
      redis.call('HSET', bk, 'cur', pid)
    end
    if btok >= 0 then redis.call('HINCRBY', bk, 't' .. pid, tokens) end
    if bcost >= 0 then redis.call('HINCRBY', bk, 'c' .. pid, cost) end
    -- kept past the period's end for the settlements of requests still running then (and the lease)
    redis.call('PEXPIRE', bk, ends[per] - now + 2 * 86400000 + lease)
  end
end
return {1, 0, 0, unpack(tail)}
"""
)

FINISH = """
local rid, actual, n, dt, dc = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
for i = 0, n - 1 do
  local tw, ts, ck, bk = KEYS[i * 4 + 1], KEYS[i * 4 + 2], KEYS[i * 4 + 3], KEYS[i * 4 + 4]
  local a = 6 + i * 3
  local btok, bcost, pid = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  if actual >= 0 then
    local old = redis.call('HGET', tw, rid)
    if old then
      redis.call('HSET', tw, rid, actual)
      redis.call('INCRBY', ts, actual - tonumber(old))
    end
  end
  redis.call('ZREM', ck, rid)
  -- budgets: the correction goes to the period the reservation was charged to, while its counter exists
  if pid ~= '' then
    if btok == '1' and dt ~= 0 and redis.call('HEXISTS', bk, 't' .. pid) == 1 then
      redis.call('HINCRBY', bk, 't' .. pid, dt)
    end
    if bcost == '1' and dc ~= 0 and redis.call('HEXISTS', bk, 'c' .. pid) == 1 then
      redis.call('HINCRBY', bk, 'c' .. pid, dc)
    end
  end
end
return 1
"""
