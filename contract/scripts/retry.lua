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
-- The helpers (show, wrong_type, counters, ...) are lib.lua's, sent before
-- this script as one body.
local function refuse(msg) return redis.error_reply('ERR backstop retry: ' .. msg) end

if #KEYS ~= 3 or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3] then
  return refuse('want 3 distinct keys: jobs, delayed, stats')
end
local bad = bad_group_entry(ARGV[1], ARGV[2])
if bad then return refuse(bad) end
local delay = whole(ARGV[3], 0, 1e13)
if not delay then
  return refuse('delay_ms must be a whole number in 0..1e13, got ' .. show(ARGV[3]))
end
if ARGV[4] ~= 'transient' and ARGV[4] ~= 'retry_after' and ARGV[4] ~= 'uncertain' then
  return refuse('reason must be transient, retry_after or uncertain, got ' .. show(ARGV[4]))
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
local due = now_ms() + delay
local member = delayed_member(job, attempt + 1, ARGV[5] or '', ARGV[4], ARGV[2], delay)
local c = counters()
local name = counted_type(KEYS[3], job.type, c)
add_typed(c, name, 'attempts:retry', 1)
add_typed(c, name, 'retries:' .. ARGV[4], 1)
return to_delayed(refuse, 'retry', KEYS, ARGV[1], ARGV[2], member, due, c)
