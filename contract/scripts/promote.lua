-- promote: move at most N due members of the delayed set to the work
-- stream, in one atomic step (no duplicate, no loss if the caller dies
-- between calls). "Due" is by the server's clock. A member moves as the job
-- retry.lua wrote only when nothing of it can be lost; any other member
-- moves raw, byte for byte, so a worker dead-letters it as malformed.
-- KEYS[1] delayed zset   KEYS[2] jobs stream   KEYS[3] stats hash
-- ARGV[1] limit (1..10000)
-- Reply: {moved, ms until the next member is due or -1 when none is left}.
-- All or nothing (README.md), member by member: the checks only read; each
-- member's XADD is its first write, and a failed one ends the batch (an
-- error when it was the first).
-- The helpers (show, wrong_type, counters, job_fields, ...) are lib.lua's,
-- sent before this script as one body.
local function refuse(msg) return redis.error_reply('ERR backstop promote: ' .. msg) end

if #KEYS ~= 3 or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3] then
  return refuse('want 3 distinct keys: delayed, jobs, stats')
end
local limit = whole(ARGV[1], 1, 10000)
if not limit then
  return refuse('limit must be a whole number in 1..10000, got ' .. show(ARGV[1]))
end
local err = wrong_type(KEYS[1], 'zset') or wrong_type(KEYS[2], 'stream')
if err then return refuse(err) end
local now = now_ms()
-- With the scores: each moved job carries its due time (due_ms), from which
-- the worker measures the latency of its retry (failure to start).
local scored = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local due, dues = {}, {}
for i = 1, #scored, 2 do
  due[#due + 1] = scored[i]
  dues[#dues + 1] = tonumber(scored[i + 1])
end
local c = counters()
if #due > 0 then add(c, 'promoted', #due) end
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
local moved, refused = move_members(KEYS[1], KEYS[2], due, refuse, dues)
if refused then return refused end
if moved > 0 then c.n.promoted = moved end
count(KEYS[3], c)
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if nxt[2] then
  -- A score of +inf is never due: report the largest exact wait instead.
  return {moved, math.min(math.max(0, tonumber(nxt[2]) - now), 9007199254740991)}
end
return {moved, -1}
