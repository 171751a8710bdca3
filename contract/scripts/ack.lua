-- ack: the job succeeded. XACK and XDEL the entry and count the outcome, in
-- one step. A second ack of the same entry (or an ack after another worker
-- moved it) changes nothing.
-- KEYS[1] jobs stream   KEYS[2] stats hash
-- ARGV[1] consumer group   ARGV[2] entry id (<ms>-<seq>)
-- Reply: 1 when acked, 0 when the entry was not pending.
-- All or nothing (README.md): the checks only read; the writes start once
-- none of them can fail.
-- The helpers (show, wrong_type, counters, ...) are lib.lua's, sent before
-- this script as one body.
local function refuse(msg) return redis.error_reply('ERR backstop ack: ' .. msg) end

if #KEYS ~= 2 or KEYS[1] == KEYS[2] then
  return refuse('want 2 distinct keys: jobs, stats')
end
local bad = bad_group_entry(ARGV[1], ARGV[2])
if bad then return refuse(bad) end
local err = wrong_type(KEYS[1], 'stream')
if err then return refuse(err) end
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then
  return 0
end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])[1]
local raw, jtype
if e then
  for i = 1, #e[2], 2 do
    if e[2][i] == 'attempt' then raw = e[2][i + 1] end
  end
  jtype = entry_type(e)
end
local attempt = attempt_of(raw)
local c = counters()
local name = counted_type(KEYS[2], jtype, c)
add_typed(c, name, 'attempts:success', 1)
add_finished(c, name, 'success', attempt)
err = bad_counters(KEYS[2], c)
if err then return refuse(err) end
-- Nothing below can fail. The counters first: when Redis is out of memory
-- it refuses a script's first write that may grow it, so the whole script.
count(KEYS[2], c)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
