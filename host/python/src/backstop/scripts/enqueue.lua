-- enqueue: add a job to the work stream, stamped with the server's clock.
-- KEYS[1] jobs stream   KEYS[2] stats hash
-- ARGV[1] job id (stable: the idempotency key)   ARGV[2] payload
-- Reply: the new entry id.
-- All or nothing (README.md): the checks only read; the XADD is the first
-- write, and the counter that follows cannot fail.
local function refuse(msg) return redis.error_reply('ERR backstop enqueue: ' .. msg) end
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

if #KEYS ~= 2 or KEYS[1] == KEYS[2] then
  return refuse('want 2 distinct keys: jobs, stats')
end
if ARGV[1] == nil or ARGV[1] == '' then
  return refuse('job id must not be empty')
end
local c = counters()
add(c, 'enqueued', 1)
local err = wrong_type(KEYS[1], 'stream') or bad_counters(KEYS[2], c)
if err then return refuse(err) end
local entry, failed = xadd(KEYS[1], {'id', ARGV[1], 'attempt', '1',
  'first_enqueued_ms', string.format('%d', now_ms()), 'payload', ARGV[2] or ''})
if not entry then return xadd_refused(KEYS[1], failed) end
count(KEYS[2], c)
return entry
