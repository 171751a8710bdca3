-- defer: move a job the policy refused to run (an open circuit breaker, an
-- empty retry budget) back to the delayed set, its attempt count UNCHANGED:
-- the job waits out the outage without spending one of its attempts, and
-- is not dead-lettered for it. XACK and XDEL the entry and count it, in one
-- atomic step. The due time is the server's clock plus the delay (the time
-- until the breaker half-opens, or the backoff for the budget).
-- KEYS[1] jobs stream   KEYS[2] delayed zset   KEYS[3] stats hash
-- ARGV[1] consumer group   ARGV[2] entry id (<ms>-<seq>)   ARGV[3] delay ms
-- (0..1e13)   ARGV[4] reason (circuit_open, budget_exhausted)
-- ARGV[5] last error ("" keeps the entry's own last_error)
-- Reply: the due time (unix ms) when moved, 0 when the entry was not pending.
-- Errors (nothing written): bad ARGV or keys, or a malformed entry (as
-- retry.lua): dead-letter it with reason "malformed".
-- The entry's prev_delay_ms is kept (the backoff sequence did not move);
-- last_reason names the deferral.
-- All or nothing (README.md): the checks only read; the writes start once
-- none of them can fail. The helpers are lib.lua's, sent before this script.
local function refuse(msg) return redis.error_reply('ERR backstop defer: ' .. msg) end

if #KEYS ~= 3 or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3] then
  return refuse('want 3 distinct keys: jobs, delayed, stats')
end
local bad = bad_group_entry(ARGV[1], ARGV[2])
if bad then return refuse(bad) end
local delay = whole(ARGV[3], 0, 1e13)
if not delay then
  return refuse('delay_ms must be a whole number in 0..1e13, got ' .. show(ARGV[3]))
end
if ARGV[4] ~= 'circuit_open' and ARGV[4] ~= 'budget_exhausted' then
  return refuse('reason must be circuit_open or budget_exhausted, got ' .. show(ARGV[4]))
end
local err = wrong_type(KEYS[1], 'stream') or wrong_type(KEYS[2], 'zset')
if err then return refuse(err) end
local e = pending_entry(KEYS[1], ARGV[1], ARGV[2])
if not e then
  return 0
end
local job, attempt = job_of(e)
if not attempt then
  return refuse('entry ' .. ARGV[2] .. ' is malformed (needs id and attempt >= 1)')
end
local last_error = ARGV[5] or ''
if last_error == '' then last_error = job.last_error or '' end
local due = now_ms() + delay
local member = delayed_member(job, attempt, last_error, ARGV[4], ARGV[2], whole(job.prev_delay_ms, 0, 1e13) or 0)
local c = counters()
local name = counted_type(KEYS[3], job.type, c)
add_typed(c, name, 'attempts:deferred', 1)
add_typed(c, name, 'deferred:' .. ARGV[4], 1)
return to_delayed(refuse, 'deferral', KEYS, ARGV[1], ARGV[2], member, due, c)
