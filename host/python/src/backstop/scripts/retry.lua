-- retry: move a failed job to the delayed set (a cold retry) with its
-- attempt count incremented, XACK and XDEL the entry, and count it: one
-- atomic step, so a crash can neither lose the job nor run it twice from
-- here. The due time is the server's clock plus the decided delay.
-- KEYS[1] jobs stream   KEYS[2] delayed zset   KEYS[3] stats hash
-- ARGV[1] consumer group   ARGV[2] entry id (<ms>-<seq>)   ARGV[3] delay ms
-- (0..1e13)   ARGV[4] retry reason (transient, retry_after, uncertain)
-- ARGV[5] last error
-- Reply: the due time (unix ms) when moved, 0 when the entry was not pending.
-- Errors (nothing written): bad ARGV or keys, or an entry without a job id
-- or with a malformed attempt (not a whole number in 1..1e14) or
-- first_enqueued_ms (not digits): dead-letter it with reason "malformed".
-- The delay is kept as prev_delay_ms for the decorrelated strategy's next
-- decision.
-- All or nothing (README.md): the checks only read; the writes start once
-- none of them can fail.
local function refuse(msg) return redis.error_reply('ERR backstop retry: ' .. msg) end
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
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

if #KEYS ~= 3 or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3] then
  return refuse('want 3 distinct keys: jobs, delayed, stats')
end
if not ARGV[1] or ARGV[1] == '' then
  return refuse('consumer group must not be empty')
end
if not entry_id(ARGV[2]) then
  return refuse('entry id must be a full stream id <ms>-<seq>, got ' .. show(ARGV[2]))
end
local delay = whole(ARGV[3], 0, 1e13)
if not delay then
  return refuse('delay_ms must be a whole number in 0..1e13, got ' .. show(ARGV[3]))
end
if ARGV[4] ~= 'transient' and ARGV[4] ~= 'retry_after' and ARGV[4] ~= 'uncertain' then
  return refuse('reason must be transient, retry_after or uncertain, got ' .. show(ARGV[4]))
end
local err = wrong_type(KEYS[1], 'stream') or wrong_type(KEYS[2], 'zset')
if err then return refuse(err) end
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then
  return 0
end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])[1]
if not e then
  return 0
end
local job = {}
for i = 1, #e[2], 2 do job[e[2][i]] = e[2][i + 1] end
local attempt = tonumber(string.match(job.attempt or '', '^[1-9]%d*$') or '')
if not job.id or job.id == '' or not attempt or attempt >= 1e14
    or not string.match(job.first_enqueued_ms or '', '^%d+$') then
  return refuse('entry ' .. ARGV[2] .. ' is malformed (needs id and attempt >= 1)')
end
local due = now_ms() + delay
local member = cjson.encode({
  id = job.id, attempt = attempt + 1, first_enqueued_ms = job.first_enqueued_ms,
  payload = job.payload or '', last_error = ARGV[5] or '', last_reason = ARGV[4], source = ARGV[2],
  prev_delay_ms = delay,
})
-- ZADD of a member already there would only move it: two jobs, one member.
if redis.call('ZSCORE', KEYS[2], member) then
  return refuse(KEYS[2] .. ' already holds this retry of entry ' .. ARGV[2])
end
local c = counters()
add(c, 'attempts:retry', 1)
add(c, 'retries:' .. ARGV[4], 1)
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
-- Nothing below can fail. The ZADD first: when Redis is out of memory it
-- refuses a script's first write that may grow it, so the whole script.
redis.call('ZADD', KEYS[2], due, member)
count(KEYS[3], c)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return due
