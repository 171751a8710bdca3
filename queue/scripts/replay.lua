-- replay: move at most N dead letters back to the work stream with the
-- attempt count reset, optionally only those with a given reason, in one
-- atomic step, and count the replays. Scans at most scan entries from the
-- cursor so a filtered replay stays bounded; call again with the cursor it
-- returns until it returns "0".
-- KEYS[1] dlq stream   KEYS[2] jobs stream   KEYS[3] stats hash
-- ARGV[1] limit (1..10000)   ARGV[2] reason ('' for any)
-- ARGV[3] cursor ('-', '0' or '' to start, else one this script returned)
-- ARGV[4] scan (limit..100000)
-- Reply: {replayed, next cursor or "0" when the stream is exhausted}.
-- All or nothing (README.md), dead letter by dead letter: the checks only
-- read; each one's XADD is its first write, and a failed one ends the batch
-- (an error when it was the first).
local function refuse(msg) return redis.error_reply('ERR backstop replay: ' .. msg) end
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
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

if #KEYS ~= 3 or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3] then
  return refuse('want 3 distinct keys: dlq, jobs, stats')
end
local limit = whole(ARGV[1], 1, 10000)
local scan = limit and whole(ARGV[4], limit, 100000)
if not limit or not scan then
  return refuse('want limit in 1..10000 and scan in limit..100000, got ' .. show(ARGV[1]) .. ', ' .. show(ARGV[4]))
end
local reason = ARGV[2] or ''
if reason ~= '' and not reason_ok(reason) then
  return refuse('reason must be "" (any) or 1..128 printable ASCII characters without spaces, got ' .. show(reason))
end
-- XRANGE would read "5000" as 5000-0, "+" as the end: only a start or a
-- cursor as returned below.
local cursor = ARGV[3] or ''
if cursor == '0' or cursor == '' then cursor = '-' end
if cursor ~= '-' and not entry_id(string.match(cursor, '^%(?(.*)$')) then
  return refuse('cursor must be "-", "0" or a cursor replay returned, got ' .. show(ARGV[3]))
end
local err = wrong_type(KEYS[1], 'stream') or wrong_type(KEYS[2], 'stream')
if err then return refuse(err) end
local entries = redis.call('XRANGE', KEYS[1], cursor, '+', 'COUNT', scan)
-- Plan first: which dead letters move, so that the counter is checked for
-- the most that can.
local plan, last = {}, nil
for _, e in ipairs(entries) do
  if #plan >= limit then break end
  last = e[1]
  local job = {}
  for i = 1, #e[2], 2 do job[e[2][i]] = e[2][i + 1] end
  -- A dead letter without a job id (a malformed entry, its body under
  -- entry.*) stays in the DLQ for a person: replaying it would lose it.
  if (reason == '' or job.reason == reason) and job.id and job.id ~= '' then
    plan[#plan + 1] = {e[1], job}
  end
end
local c = counters()
if #plan > 0 then add(c, 'replayed', #plan) end
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
local moved = 0
for _, p in ipairs(plan) do
  local job = p[2]
  local id, failed = xadd(KEYS[2], {'id', job.id, 'attempt', '1',
    'first_enqueued_ms', string.format('%d', now_ms()),
    'payload', job.payload or '', 'replayed_from', p[1], 'last_reason', job.reason or ''})
  if not id then
    if moved == 0 then return xadd_refused(KEYS[2], failed) end
    -- Resume after the last one that moved.
    last = plan[moved][1]
    break
  end
  redis.call('XDEL', KEYS[1], p[1])
  moved = moved + 1
end
if moved > 0 then c.n.replayed = moved end
count(KEYS[3], c)
if moved == #plan and #entries < scan and (last == nil or last == entries[#entries][1]) then
  return {moved, '0'}
end
return {moved, '(' .. last}
