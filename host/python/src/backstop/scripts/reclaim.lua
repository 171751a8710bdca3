-- reclaim: take over entries that crashed consumers left pending for longer
-- than min_idle. An entry delivered max_deliveries times already is a crash
-- loop: it goes to the dead letter stream (reason crash_loop) instead of
-- being delivered again. Pending entries whose data was deleted are acked.
-- A crash loop that cannot be dead-lettered (the DLQ refuses it) is skipped:
-- it stays pending, claimed with JUSTID (its delivery count unchanged, its
-- idle time reset, so it does not take every batch), reported, and counted
-- (reclaim_skipped); the rest of the batch goes on.
-- KEYS[1] jobs stream   KEYS[2] dlq stream   KEYS[3] stats hash
-- ARGV[1] consumer group   ARGV[2] consumer taking the entries
-- ARGV[3] min idle ms (0..2^53-1)   ARGV[4] count (1..1000)
-- ARGV[5] max deliveries (1..2^53-1)
-- Reply: {dead-lettered count, {claimed entries, as XCLAIM returns them},
-- {{skipped entry id, why}, ...}}.
-- All or nothing (README.md), entry by entry: the checks only read; a crash
-- loop's XADD is its first write, and a failed one skips it.
local function refuse(msg) return redis.error_reply('ERR backstop reclaim: ' .. msg) end
-- ARGV s as a whole number in lo..hi (hi < 2^53), or nil: decimal digits
-- only, as Lua's tonumber also reads " 5", "0x10", "1e3", "inf" and "nan".
local function whole(s, lo, hi)
  if not s or #s > 16 or not (s == '0' or string.find(s, '^[1-9]%d*$')) then return nil end
  local n = tonumber(s)
  if n >= lo and n <= hi then return n end
end
-- s quoted for an error message: at most 64 bytes, escaped.
local function show(s)
  s = tostring(s)
  local cut = #s > 64
  s = string.gsub(string.sub(s, 1, 64), '.', function(ch)
    local b = string.byte(ch)
    if b < 32 or b > 126 or ch == '"' or ch == '\\' then return string.format('\\%03d', b) end
  end)
  return '"' .. s .. '"' .. (cut and '...' or '')
end
-- Why key cannot be used as a `want`, or nil (a missing key is fine).
local function wrong_type(key, want)
  local t = redis.call('TYPE', key).ok
  if t ~= want and t ~= 'none' then return key .. ' is a ' .. t .. ', not a ' .. want end
end
-- Whether HINCRBY can add n (0 <= n < 2^53) to the hash value v: v is an
-- integer as Redis reads one (no sign +, no leading zero, int64) and the sum
-- stays in int64 (compared in two exact halves: Lua numbers are doubles).
local function addable(v, n)
  if v == '0' then return true end
  local neg, d = string.match(v, '^(%-?)([1-9]%d*)$')
  if not d or #d > 19 then return false end
  if neg == '-' then return #d < 19 or d <= '9223372036854775808' end
  if #d == 19 and d > '9223372036854775807' then return false end
  local hi, lo = tonumber(string.sub(d, 1, -10)) or 0, tonumber(string.sub(d, -9)) + n % 1e9
  hi = hi + math.floor(n / 1e9) + math.floor(lo / 1e9)
  return hi < 9223372036 or (hi == 9223372036 and lo % 1e9 <= 854775807)
end
-- Counters to add: {order = {field, ...}, n = {[field] = increment}}.
local function counters() return {order = {}, n = {}} end
local function add(c, f, n)
  if not c.n[f] then c.order[#c.order + 1] = f; c.n[f] = 0 end
  c.n[f] = c.n[f] + n
end
-- Why the counters c cannot all be added to the hash key, or nil.
local function bad_counters(key, c)
  local err = wrong_type(key, 'hash')
  if err or #c.order == 0 then return err end
  local vals = redis.call('HMGET', key, unpack(c.order))
  for i, f in ipairs(c.order) do
    if vals[i] and not addable(vals[i], c.n[f]) then
      return key .. ' field ' .. show(f) .. ' holds ' .. show(vals[i]) .. ': HINCRBY cannot add ' .. c.n[f] .. ' to it'
    end
  end
end
local function count(key, c)
  for _, f in ipairs(c.order) do
    if c.n[f] ~= 0 then redis.call('HINCRBY', key, f, string.format('%d', c.n[f])) end
  end
end
-- XADD key * fields...: the entry id, or nil and Redis' error. A failed
-- XADD writes nothing.
local function xadd(key, fields)
  local r = redis.pcall('XADD', key, '*', unpack(fields))
  if type(r) == 'table' and r.err then return nil, r.err end
  return r
end
-- The dead letter of entry e ({id, {name, value, ...}}): the contract's
-- fields, then every other field of the entry (a malformed entry's whole
-- body; a duplicate name too) under "entry.". An entry with more than 1000
-- other fields keeps them all in one field, entry_fields, a JSON array
-- [name, value, ...] (cjson: bytes that are not UTF-8 are kept as they
-- are): XADD's arguments come from the Lua stack, which holds about 8000.
local function dead_letter_fields(e, reason, err, now)
  local f, last = e[2], {}
  for i = 1, #f, 2 do last[f[i]] = i end
  local function get(k) return last[k] and f[last[k] + 1] or '' end
  local out = {'reason', reason, 'error', err, 'attempt', get('attempt'), 'id', get('id'),
    'source_id', e[1], 'first_enqueued_ms', get('first_enqueued_ms'), 'payload', get('payload'),
    'dead_lettered_ms', now}
  local known, other = {id = 1, attempt = 1, first_enqueued_ms = 1, payload = 1}, {}
  for i = 1, #f, 2 do
    if not (known[f[i]] and last[f[i]] == i) then
      other[#other + 1] = f[i]
      other[#other + 1] = f[i + 1]
    end
  end
  if #other > 2000 then
    out[#out + 1] = 'entry_fields'
    out[#out + 1] = cjson.encode(other)
  else
    for i = 1, #other, 2 do
      out[#out + 1] = 'entry.' .. other[i]
      out[#out + 1] = other[i + 1]
    end
  end
  return out
end
-- The attempt an entry finished on, for the counters: a whole number in
-- 1..1e6 (max_attempts' bound) whatever the entry says, so none overflows.
local function attempt_of(raw)
  return math.min(tonumber(string.match(raw or '', '^[1-9]%d*$') or '1'), 1e6)
end
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

if #KEYS ~= 3 or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3] then
  return refuse('want 3 distinct keys: jobs, dlq, stats')
end
if not ARGV[1] or ARGV[1] == '' or not ARGV[2] or ARGV[2] == '' then
  return refuse('consumer group and consumer must not be empty')
end
local idle = whole(ARGV[3], 0, 9007199254740991)
local count_, maxd = whole(ARGV[4], 1, 1000), whole(ARGV[5], 1, 9007199254740991)
if not idle or not count_ or not maxd then
  return refuse('want min_idle >= 0, count in 1..1000, max_deliveries >= 1 (whole numbers), got '
    .. show(ARGV[3]) .. ', ' .. show(ARGV[4]) .. ', ' .. show(ARGV[5]))
end
local err = wrong_type(KEYS[1], 'stream')
if err then return refuse(err) end
-- A DLQ of the wrong type refuses crash loops only: they are skipped.
local dlq_err = wrong_type(KEYS[2], 'stream')
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], '-', '+', ARGV[4])
local now = string.format('%d', now_ms())
-- Read every entry and plan its move; count for the most that can move.
local gone, loops, claim = {}, {}, {}
local c = counters()
for _, p in ipairs(pending) do
  local id, deliveries = p[1], p[4]
  local e = redis.call('XRANGE', KEYS[1], id, id)[1]
  if not e then
    gone[#gone + 1] = id
  elseif deliveries >= maxd then
    local fields = dead_letter_fields(e, 'crash_loop', 'delivered ' .. deliveries .. ' times without an outcome', now)
    local attempt = attempt_of(fields[6])
    loops[#loops + 1] = {id = id, fields = fields, attempt = attempt,
      bucket = 'finished:dead_letter:' .. (attempt > 64 and 'inf' or tostring(attempt))}
    add(c, 'attempts:dead_letter', 1)
    add(c, 'dead_letters:crash_loop', 1)
    add(c, loops[#loops].bucket, 1)
    add(c, 'finished_sum:dead_letter', attempt)
    add(c, 'reclaim_skipped', 1)
  else
    claim[#claim + 1] = id
  end
end
if #claim > 0 then add(c, 'reclaimed', #claim) end
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
-- The writes. Only a crash loop's XADD can fail (it writes nothing then).
local done = counters()
for _, id in ipairs(gone) do
  redis.call('XACK', KEYS[1], ARGV[1], id)
end
local dead, skipped = 0, {}
for _, l in ipairs(loops) do
  local ok, failed = nil, dlq_err
  if not dlq_err then
    ok, failed = xadd(KEYS[2], l.fields)
  end
  if ok then
    add(done, 'attempts:dead_letter', 1)
    add(done, 'dead_letters:crash_loop', 1)
    add(done, l.bucket, 1)
    add(done, 'finished_sum:dead_letter', l.attempt)
    redis.call('XACK', KEYS[1], ARGV[1], l.id)
    redis.call('XDEL', KEYS[1], l.id)
    dead = dead + 1
  else
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], l.id, 'JUSTID')
    add(done, 'reclaim_skipped', 1)
    skipped[#skipped + 1] = {l.id, 'not dead-lettered: ' .. failed}
  end
end
local claimed = {}
if #claim > 0 then
  claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], unpack(claim))
  add(done, 'reclaimed', #claimed)
end
count(KEYS[3], done)
return {dead, claimed, skipped}
