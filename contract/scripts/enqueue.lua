-- enqueue: add a job to the work stream, stamped with the server's clock.
-- KEYS[1] jobs stream   KEYS[2] stats hash
-- ARGV[1] job id (stable: the idempotency key)   ARGV[2] payload
-- ARGV[3] job type (optional; "" or absent: untyped): 1..64 bytes of
-- [A-Za-z0-9_./-], written as the entry's field type
-- Reply: the new entry id.
-- All or nothing (README.md): the checks only read; the XADD is the first
-- write, and the counter that follows cannot fail.
-- The helpers (show, wrong_type, counters, ...) are lib.lua's, sent before
-- this script as one body.
local function refuse(msg) return redis.error_reply('ERR backstop enqueue: ' .. msg) end

if #KEYS ~= 2 or KEYS[1] == KEYS[2] then
  return refuse('want 2 distinct keys: jobs, stats')
end
if ARGV[1] == nil or ARGV[1] == '' then
  return refuse('job id must not be empty')
end
local jtype = ARGV[3] or ''
if jtype ~= '' and not type_ok(jtype) then
  return refuse('type must be 1..64 bytes of [A-Za-z0-9_./-], got ' .. show(jtype))
end
local c = counters()
add(c, 'enqueued', 1)
local err = wrong_type(KEYS[1], 'stream') or bad_counters(KEYS[2], c)
if err then return refuse(err) end
local fields = {'id', ARGV[1], 'attempt', '1',
  'first_enqueued_ms', string.format('%d', now_ms()), 'payload', ARGV[2] or ''}
if jtype ~= '' then
  fields[#fields + 1] = 'type'
  fields[#fields + 1] = jtype
end
local entry, failed = xadd(KEYS[1], fields)
if not entry then return xadd_refused(refuse, KEYS[1], failed) end
count(KEYS[2], c)
return entry
