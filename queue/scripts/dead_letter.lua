-- dead_letter: move a job to the dead letter stream with the reason, the
-- last error and its attempt count, XACK and XDEL the entry, and count it,
-- in one atomic step. Works on malformed entries too: every field of the
-- entry is kept.
-- KEYS[1] jobs stream   KEYS[2] dlq stream   KEYS[3] stats hash
-- ARGV[1] consumer group   ARGV[2] entry id (<ms>-<seq>)
-- ARGV[3] reason (1..128 printable ASCII characters, no spaces)
-- ARGV[4] last error
-- Reply: the DLQ entry id, or 0 when the entry was not pending.
-- All or nothing (README.md): the checks only read; the XADD is the first
-- write, and nothing after it can fail.
local function refuse(msg) return redis.error_reply('ERR backstop dead_letter: ' .. msg) end
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
-- A reason: 1..128 printable ASCII characters, no spaces. It names a stats
-- field and a Prometheus label (the exporter skips fields not in UTF-8).
local function reason_ok(s)
  return s ~= nil and #s <= 128 and string.find(s, '^[!-~]+$') ~= nil
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
-- The reply for an XADD that failed with e: ours when the data is at fault,
-- Redis' own when the server refuses writes for now (OOM, READONLY, ...),
-- so that the caller knows to try again.
local function xadd_refused(key, e)
  if string.find(e, '^ERR ') then return refuse('cannot add to ' .. key .. ': ' .. string.sub(e, 5)) end
  return redis.error_reply(e)
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
if not ARGV[1] or ARGV[1] == '' then
  return refuse('consumer group must not be empty')
end
if not entry_id(ARGV[2]) then
  return refuse('entry id must be a full stream id <ms>-<seq>, got ' .. show(ARGV[2]))
end
if ARGV[3] == nil or ARGV[3] == '' then
  return refuse('reason must not be empty')
end
if not reason_ok(ARGV[3]) then
  return refuse('reason must be 1..128 printable ASCII characters without spaces, got ' .. show(ARGV[3]))
end
local err = wrong_type(KEYS[1], 'stream') or wrong_type(KEYS[2], 'stream')
if err then return refuse(err) end
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then
  return 0
end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])[1]
if not e then
  return 0
end
local fields = dead_letter_fields(e, ARGV[3], ARGV[4] or '', string.format('%d', now_ms()))
local attempt = attempt_of(fields[6])
local c = counters()
add(c, 'attempts:dead_letter', 1)
add(c, 'dead_letters:' .. ARGV[3], 1)
add(c, 'finished:dead_letter:' .. (attempt > 64 and 'inf' or tostring(attempt)), 1)
add(c, 'finished_sum:dead_letter', attempt)
if ARGV[3] == 'max_attempts_reached' then
  add(c, 'max_attempts_reached', 1)
end
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
local id, failed = xadd(KEYS[2], fields)
if not id then return xadd_refused(KEYS[2], failed) end
count(KEYS[3], c)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return id
