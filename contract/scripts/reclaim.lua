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
-- The helpers (show, wrong_type, counters, ...) are lib.lua's, sent before
-- this script as one body.
local function refuse(msg) return redis.error_reply('ERR backstop reclaim: ' .. msg) end

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
local c, done = counters(), counters()
-- A type registered for a crash loop stays registered even when the loop is
-- skipped: the registrations go to both counters.
local reg = type_registry(KEYS[3])
for _, p in ipairs(pending) do
  local id, deliveries = p[1], p[4]
  local e = redis.call('XRANGE', KEYS[1], id, id)[1]
  if not e then
    gone[#gone + 1] = id
  elseif deliveries >= maxd then
    local fields = dead_letter_fields(e, 'crash_loop', 'delivered ' .. deliveries .. ' times without an outcome', now)
    local attempt = attempt_of(fields[6])
    local name, overflow = type_name(reg, entry_type(e), {c, done})
    loops[#loops + 1] = {id = id, fields = fields, attempt = attempt, name = name, overflow = overflow}
    if overflow then add(c, 'types:overflow', 1) end
    add_typed(c, name, 'attempts:dead_letter', 1)
    add_typed(c, name, 'dead_letters:crash_loop', 1)
    add_finished(c, name, 'dead_letter', attempt)
    add(c, 'reclaim_skipped', 1)
  else
    claim[#claim + 1] = id
  end
end
if #claim > 0 then add(c, 'reclaimed', #claim) end
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
-- The writes. Only a crash loop's XADD can fail (it writes nothing then).
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
    if l.overflow then add(done, 'types:overflow', 1) end
    add_typed(done, l.name, 'attempts:dead_letter', 1)
    add_typed(done, l.name, 'dead_letters:crash_loop', 1)
    add_finished(done, l.name, 'dead_letter', l.attempt)
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
