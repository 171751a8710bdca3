-- lib: the helpers the queue scripts share. Not a script of its own: a
-- prelude. Every host sends lib.lua, a newline, then the script
-- (lib.lua .. "\n" .. <name>.lua) as one script body, for EVALSHA, EVAL
-- and SCRIPT LOAD alike (queue/redisqueue/README.md, "Loading the scripts").
-- It defines local functions only and runs nothing when the body starts:
-- no Redis call, no global set, no other side effect. So a script that uses
-- none of them (hold) behaves as it would alone. A script must not start
-- with a shebang (#!lua flags=...): it would no longer be the first line.
-- No script defines one of these again (scripts_test.go checks it); each
-- keeps its own refuse(msg), the error reply naming the script.
-- Line numbers: Redis reports an error at line N of the body
-- (user_script:N); the script's own line is N minus this file's line
-- count, minus 1 for the newline between them.
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
-- A pass of replay or discard over the DLQ, from the cursor ARGV c: '-',
-- '0' or '' start one, which ends at the DLQ's last entry as it is then;
-- '(<last>..<end>' (the cursor a call returned) goes on after <last> up to
-- <end>. So dead letters added during the pass (a replayed job failing
-- again while workers run) wait for the next one: a pass takes each dead
-- letter at most once, and ends. Returns the XRANGE start ('-' or
-- '(<last>') and end (nil when the pass starts: the caller reads the
-- DLQ's last entry), or nil for any other cursor.
local function dlq_pass(c)
  if c == nil or c == '' or c == '-' or c == '0' then return '-' end
  local from, to = string.match(c, '^%(([^.]+)%.%.(.+)$')
  if from and entry_id(from) and entry_id(to) then return '(' .. from, to end
end
-- The DLQ's last entry id (the end of a pass that starts now), or nil
-- when the DLQ is empty.
local function dlq_end(key)
  local tail = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
  return tail and tail[1]
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
-- A job type (queue/redisqueue/README.md, "Job types"): 1..64 bytes of
-- [A-Za-z0-9_./-]. No ':', which separates the fields of the counters
-- t:<type>:<counter>.
local function type_ok(s)
  return s ~= nil and #s <= 64 and string.find(s, '^[A-Za-z0-9_./%-]+$') ~= nil
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
-- Why ARGV group (a consumer group) and id (an entry id) cannot be used, or
-- nil.
local function bad_group_entry(group, id)
  if not group or group == '' then return 'consumer group must not be empty' end
  if not entry_id(id) then return 'entry id must be a full stream id <ms>-<seq>, got ' .. show(id) end
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
-- The job types counted by name in the stats hash: a type is registered
-- once its field types:known:<T> exists; a new valid one is registered while
-- types < types:limit (a positive integer, else 50). Reads only: the
-- registrations join the counters (checked, then written, as the others).
local function type_registry(stats)
  return {stats = stats, bad = wrong_type(stats, 'hash') ~= nil, known = {}}
end
-- The name the counters of a job of type t go under: nil for an untyped job
-- (t nil); t once registered, or registered now (HINCRBY types:known:<t>
-- and types, added to each counters of cs); 'other' for a type not valid
-- (an entry written by someone else), for 'other' itself, and for a valid
-- one past the limit, then with overflow true (types:overflow, one per
-- counted event: the caller adds it).
local function type_name(reg, t, cs)
  if t == nil then return nil end
  if t == 'other' or not type_ok(t) then return 'other' end
  if reg.known[t] == nil then
    reg.known[t] = not reg.bad and redis.call('HEXISTS', reg.stats, 'types:known:' .. t) == 1
  end
  if reg.known[t] then return t end
  if reg.limit == nil then
    local v = reg.bad and {} or redis.call('HMGET', reg.stats, 'types', 'types:limit')
    -- A types that is not an integer: register, so that its check refuses.
    reg.n = (not v[1] and 0) or (addable(v[1], 1) and tonumber(v[1])) or -1
    reg.limit = whole(v[2], 1, 9007199254740991) or 50
  end
  if reg.n >= reg.limit then return 'other', true end
  reg.known[t], reg.n = true, reg.n + 1
  for _, c in ipairs(cs) do
    add(c, 'types:known:' .. t, 1)
    add(c, 'types', 1)
  end
  return t
end
-- type_name for a script with one counters c: a new type's registration
-- and an overflow both go to c.
local function counted_type(stats, t, c)
  local name, overflow = type_name(type_registry(stats), t, {c})
  if overflow then add(c, 'types:overflow', 1) end
  return name
end
-- Adds n to the queue's field f and, for a job counted by type (name, from
-- type_name), to t:<name>:f.
local function add_typed(c, name, f, n)
  add(c, f, n)
  if name then add(c, 't:' .. name .. ':' .. f, n) end
end
-- Counts a job that finished (outcome success or dead_letter) on attempt:
-- the attempt histogram's bucket (1..64 exactly, inf above) and its sum.
local function add_finished(c, name, outcome, attempt)
  add_typed(c, name, 'finished:' .. outcome .. ':' .. (attempt > 64 and 'inf' or tostring(attempt)), 1)
  add_typed(c, name, 'finished_sum:' .. outcome, attempt)
end
-- The delayed set's member for job (job_of) going back with attempt, as
-- retry and defer write it. The type (absent: untyped) is added apart: a
-- key in the constructor, even nil (so is setting it to nil), would change
-- the order cjson writes an untyped member's keys in.
local function delayed_member(job, attempt, last_error, last_reason, source, prev_delay_ms)
  local fields = {
    id = job.id, attempt = attempt, first_enqueued_ms = job.first_enqueued_ms,
    payload = job.payload or '', last_error = last_error, last_reason = last_reason, source = source,
    prev_delay_ms = prev_delay_ms,
  }
  if job.type then fields.type = job.type end
  return cjson.encode(fields)
end
-- The type field of entry e ({id, {name, value, ...}}): its last value, as
-- the workers read it; nil when absent (an untyped job).
local function entry_type(e)
  local t
  for i = 1, #e[2], 2 do
    if e[2][i] == 'type' then t = e[2][i + 1] end
  end
  return t
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
-- XADD key MAXLEN ~ 10000 * fields...: a record of the audit stream
-- (discard, replay, run), which keeps about the last 10,000; the entry id,
-- or nil and Redis' error.
local function audit_add(key, fields)
  local r = redis.pcall('XADD', key, 'MAXLEN', '~', '10000', '*', unpack(fields))
  if type(r) == 'table' and r.err then return nil, r.err end
  return r
end
-- The reply for an XADD that failed with e: ours (refuse, the script's own
-- error reply) when the data is at fault, Redis' own when the server refuses
-- writes for now (OOM, READONLY, ...), so that the caller knows to try again.
local function xadd_refused(refuse, key, e)
  if string.find(e, '^ERR ') then return refuse('cannot add to ' .. key .. ': ' .. string.sub(e, 5)) end
  return redis.error_reply(e)
end
-- Whether a < b by their bytes: Lua's < compares by the server's locale.
local function bytes_less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
-- The "fields JSON" of a plain entry (queue/redisqueue/README.md, "Plain producers"):
-- each name once with its last value, names in byte order, no spaces; only
-- \, " and bytes below 0x20 escaped, every other byte as it is.
local function fields_json(last, f)
  local names = {}
  for k in pairs(last) do names[#names + 1] = k end
  table.sort(names, bytes_less)
  local function quote(s)
    return '"' .. string.gsub(s, '[%z\1-\31\\"]', function(ch)
      if ch == '\\' or ch == '"' then return '\\' .. ch end
      return string.format('\\u%04x', string.byte(ch))
    end) .. '"'
  end
  local parts = {}
  for i, k in ipairs(names) do parts[i] = quote(k) .. ':' .. quote(f[last[k] + 1]) end
  return '{' .. table.concat(parts, ',') .. '}'
end
-- The job of a plain entry e, one written by a producer that knows nothing
-- of backstop (no id, attempt, first_enqueued_ms nor
-- malformed_delayed_member): attempt 1, its id the entry's, first enqueued
-- at the entry's time, its payload the payload field or else the fields
-- JSON. Returns the job and the consumed table (the index of each field the
-- job holds), or nil when e is not plain. A time past 2^53-1 ms gives a job
-- without first_enqueued_ms: malformed.
local function plain_job(e)
  local f, last = e[2], {}
  for i = 1, #f, 2 do last[f[i]] = i end
  if last.id or last.attempt or last.first_enqueued_ms or last.malformed_delayed_member then return nil end
  local ms = string.match(e[1], '^(%d+)%-')
  local job = {id = e[1], attempt = '1', last_error = '', last_reason = '', prev_delay_ms = '0'}
  if #ms < 16 or (#ms == 16 and ms <= '9007199254740991') then job.first_enqueued_ms = ms end
  local consumed = {}
  if last.type then
    job.type = f[last.type + 1]
    consumed[last.type] = true
  end
  if last.payload then
    job.payload = f[last.payload + 1]
    consumed[last.payload] = true
  else
    job.payload = fields_json(last, f)
    for _, i in pairs(last) do consumed[i] = true end
  end
  return job, consumed
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
  local job, consumed = plain_job(e)
  if not job then
    job, consumed = {id = get('id'), attempt = get('attempt'), first_enqueued_ms = get('first_enqueued_ms'),
      payload = get('payload'), type = last.type and get('type')}, {}
    for _, k in ipairs({'id', 'attempt', 'first_enqueued_ms', 'payload', 'type'}) do
      if last[k] then consumed[last[k]] = true end
    end
  end
  local out = {'reason', reason, 'error', err, 'attempt', job.attempt, 'id', job.id,
    'source_id', e[1], 'first_enqueued_ms', job.first_enqueued_ms or '', 'payload', job.payload,
    'dead_lettered_ms', now}
  -- The job's type travels as its own field (absent: untyped).
  if job.type then
    out[#out + 1] = 'type'
    out[#out + 1] = job.type
  end
  local other = {}
  for i = 1, #f, 2 do
    if not consumed[i] then
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
-- The raw entry ({id, {field, value, ...}}) of id in the stream jobs when it
-- is pending in group; nil when it is not (another worker moved it first)
-- or its data is gone.
local function pending_entry(jobs, group, id)
  if #redis.call('XPENDING', jobs, group, id, id, 1) == 0 then return nil end
  return redis.call('XRANGE', jobs, id, id)[1]
end
-- The fields of entry e by name (a name given twice: its last value, as
-- the workers read it) and its attempt, a whole number in 1..1e14-1, when e
-- is a well-formed job (an id, digits for first_enqueued_ms); else nil. A
-- plain entry is its plain_job, on attempt 1.
local function job_of(e)
  local job = plain_job(e)
  if job then return job, job.first_enqueued_ms and 1 or nil end
  job = {}
  for i = 1, #e[2], 2 do job[e[2][i]] = e[2][i + 1] end
  local attempt = tonumber(string.match(job.attempt or '', '^[1-9]%d*$') or '')
  if not job.id or job.id == '' or not attempt or attempt >= 1e14
      or not string.match(job.first_enqueued_ms or '', '^%d+$') then
    return job, nil
  end
  return job, attempt
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
-- The stream fields of a member retry.lua wrote, or nil for any other: a
-- JSON object of the fields below and nothing else, each once, strings
-- (copied byte for byte) or, for attempt, first_enqueued_ms and
-- prev_delay_ms, whole numbers of at most 15 digits (exact as Lua numbers,
-- so copied digit for digit). due_ms (the member's due time, promote.lua's
-- only: a worker measures the retry latency from it and prev_delay_ms) is
-- written after prev_delay_ms when due is a whole number of ms in
-- 0..10^15-1; the job type (type) is written last, and only when the member
-- has one.
-- promote.lua and run.lua move members with it.
local function job_fields(m, due)
  local STRING, NUMBER = 1, 2
  local MEMBER = {id = STRING, attempt = NUMBER, first_enqueued_ms = NUMBER, payload = STRING,
    last_error = STRING, last_reason = STRING, source = STRING, prev_delay_ms = NUMBER, type = STRING}
  local ok, job = pcall(cjson.decode, m)
  if not ok or type(job) ~= 'table' then return nil end
  -- What is left without the strings: braces, colons, commas, blanks and
  -- digits only, or a number (a fraction, an exponent, a sign, hex, inf,
  -- nan, over 15 digits), a literal, an array or a nested object is there.
  local rest = string.gsub(string.gsub(m, '\\.', ''), '"[^"]*"', '""')
  if not string.find(rest, '^%s*{[%s":,%d]*}%s*$') or string.find(rest, '%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d')
      or string.find(rest, '[^%d]0%d') then
    return nil
  end
  local _, colons = string.gsub(rest, ':', '')
  local keys = 0
  for k, v in pairs(job) do
    keys = keys + 1
    local want = MEMBER[k]
    if not want or not (type(v) == 'string' or (want == NUMBER and type(v) == 'number')) then return nil end
    if type(v) == 'number' then job[k] = string.format('%d', v) end
  end
  -- A name given twice decodes once: the other value would be lost.
  if keys ~= colons or type(job.id) ~= 'string' or job.id == '' then return nil end
  local f = {'id', job.id, 'attempt', job.attempt or '', 'first_enqueued_ms', job.first_enqueued_ms or '',
    'payload', job.payload or '', 'last_error', job.last_error or '', 'last_reason', job.last_reason or '',
    'prev_delay_ms', job.prev_delay_ms or '0'}
  if due and due >= 0 and due < 1e15 and due == math.floor(due) then
    f[#f + 1] = 'due_ms'
    f[#f + 1] = string.format('%d', due)
  end
  if job.type then
    f[#f + 1] = 'type'
    f[#f + 1] = job.type
  end
  return f
end
-- Moves members of the delayed set to the jobs stream in order, each as
-- the job it holds (job_fields) or raw as malformed_delayed_member, XADD
-- first; stops at the first XADD that fails. Returns how many moved, and
-- the error reply when not even the first could (then nothing was written).
-- dues (optional) holds each member's score, by index: the due_ms field.
local function move_members(delayed, jobs, members, refuse, dues)
  local moved = 0
  for i, m in ipairs(members) do
    local id, failed = xadd(jobs, job_fields(m, dues and dues[i]) or {'malformed_delayed_member', m})
    if not id then
      if moved == 0 then return 0, xadd_refused(refuse, jobs, failed) end
      break
    end
    redis.call('ZREM', delayed, m)
    moved = moved + 1
  end
  return moved
end
-- Moves the pending entry id of keys[1] (jobs) to keys[2] (the delayed
-- set) as member, due at due, adding the counters c to keys[3] (stats): a
-- retry or a deferral (what, for the refusal). The checks first: a member
-- already there (ZADD would only move it: two jobs, one member) and the
-- counters. Then the writes, the ZADD first: when Redis is out of memory it
-- refuses a script's first write that may grow it, so the whole script.
-- Returns due, or the error reply with nothing written.
local function to_delayed(refuse, what, keys, group, id, member, due, c)
  if redis.call('ZSCORE', keys[2], member) then
    return refuse(keys[2] .. ' already holds this ' .. what .. ' of entry ' .. id)
  end
  local err = bad_counters(keys[3], c)
  if err then return refuse(err) end
  redis.call('ZADD', keys[2], due, member)
  count(keys[3], c)
  redis.call('XACK', keys[1], group, id)
  redis.call('XDEL', keys[1], id)
  return due
end
