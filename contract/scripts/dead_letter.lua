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
-- The helpers (show, wrong_type, counters, ...) are lib.lua's, sent before
-- this script as one body.
local function refuse(msg) return redis.error_reply('ERR backstop dead_letter: ' .. msg) end

if #KEYS ~= 3 or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3] then
  return refuse('want 3 distinct keys: jobs, dlq, stats')
end
local bad = bad_group_entry(ARGV[1], ARGV[2])
if bad then return refuse(bad) end
if ARGV[3] == nil or ARGV[3] == '' then
  return refuse('reason must not be empty')
end
if not reason_ok(ARGV[3]) then
  return refuse('reason must be 1..128 printable ASCII characters without spaces, got ' .. show(ARGV[3]))
end
local err = wrong_type(KEYS[1], 'stream') or wrong_type(KEYS[2], 'stream')
if err then return refuse(err) end
local e = pending_entry(KEYS[1], ARGV[1], ARGV[2])
if not e then
  return 0
end
local fields = dead_letter_fields(e, ARGV[3], ARGV[4] or '', string.format('%d', now_ms()))
local attempt = attempt_of(fields[6])
local c = counters()
local name = counted_type(KEYS[3], entry_type(e), c)
add_typed(c, name, 'attempts:dead_letter', 1)
add_typed(c, name, 'dead_letters:' .. ARGV[3], 1)
add_finished(c, name, 'dead_letter', attempt)
if ARGV[3] == 'max_attempts_reached' then
  add_typed(c, name, 'max_attempts_reached', 1)
end
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
local id, failed = xadd(KEYS[2], fields)
if not id then return xadd_refused(refuse, KEYS[2], failed) end
count(KEYS[3], c)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return id
