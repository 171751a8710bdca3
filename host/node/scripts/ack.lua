-- ack: the job succeeded. XACK and XDEL the entry and count the outcome, in
-- one step. A second ack of the same entry (or an ack after another worker
-- moved it) changes nothing.
-- KEYS[1] jobs stream   KEYS[2] stats hash
-- ARGV[1] consumer group   ARGV[2] entry id (<ms>-<seq>)
-- Reply: 1 when acked, 0 when the entry was not pending.
-- All or nothing (README.md): the checks only read; the writes start once
-- none of them can fail.
local function refuse(msg) return redis.error_reply('ERR backstop ack: ' .. msg) end
-- A full stream id, <ms>-<seq>, each a canonical decimal below 2^64:
-- Redis reads "5000" as 5000-0 in XACK but as 5000-0..5000-max in XPENDING.
local function u64(d)
  return (d == '0' or string.find(d, '^[1-9]%d*$') ~= nil)
    and (#d < 20 or (#d == 20 and d <= '18446744073709551615'))
end
local function entry_id(s)
  local ms, seq = string.match(s or '', '^(%d+)%-(%d+)$')
  return ms ~= nil and u64(ms) and u64(seq)
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
-- The attempt an entry finished on, for the counters: a whole number in
-- 1..1e6 (max_attempts' bound) whatever the entry says, so none overflows.
local function attempt_of(raw)
  return math.min(tonumber(string.match(raw or '', '^[1-9]%d*$') or '1'), 1e6)
end

if #KEYS ~= 2 or KEYS[1] == KEYS[2] then
  return refuse('want 2 distinct keys: jobs, stats')
end
if not ARGV[1] or ARGV[1] == '' then
  return refuse('consumer group must not be empty')
end
if not entry_id(ARGV[2]) then
  return refuse('entry id must be a full stream id <ms>-<seq>, got ' .. show(ARGV[2]))
end
local err = wrong_type(KEYS[1], 'stream')
if err then return refuse(err) end
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then
  return 0
end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])[1]
local raw
if e then
  for i = 1, #e[2], 2 do
    if e[2][i] == 'attempt' then raw = e[2][i + 1] end
  end
end
local attempt = attempt_of(raw)
local c = counters()
add(c, 'attempts:success', 1)
add(c, 'finished:success:' .. (attempt > 64 and 'inf' or tostring(attempt)), 1)
add(c, 'finished_sum:success', attempt)
err = bad_counters(KEYS[2], c)
if err then return refuse(err) end
-- Nothing below can fail. The counters first: when Redis is out of memory
-- it refuses a script's first write that may grow it, so the whole script.
count(KEYS[2], c)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
