-- retry: move a failed job to the delayed set (a cold retry) with its
-- attempt count incremented, XACK and XDEL the entry, and count it: one
-- atomic step, so a crash can neither lose the job nor run it twice from
-- here. The due time is the server's clock plus the decided delay.
-- KEYS[1] jobs stream   KEYS[2] delayed zset   KEYS[3] stats hash
-- ARGV[1] consumer group   ARGV[2] entry id   ARGV[3] delay ms (>= 0)
-- ARGV[4] retry reason (transient, retry_after, uncertain)   ARGV[5] last error
-- Reply: the due time (unix ms) when moved, 0 when the entry was not pending.
-- Errors (nothing written): a bad delay, or an entry without a job id or
-- with a malformed attempt (not a whole number in 1..1e14) or
-- first_enqueued_ms (not digits): dead-letter it
-- with reason "malformed". The delay is kept as prev_delay_ms for the
-- decorrelated strategy's next decision.
local delay = tonumber(ARGV[3])
if not delay or delay < 0 or delay > 1e13 or delay ~= math.floor(delay) then
  return redis.error_reply('ERR backstop retry: delay_ms must be a whole number in 0..1e13, got ' .. tostring(ARGV[3]))
end
if ARGV[4] ~= 'transient' and ARGV[4] ~= 'retry_after' and ARGV[4] ~= 'uncertain' then
  return redis.error_reply('ERR backstop retry: reason must be transient, retry_after or uncertain, got ' .. tostring(ARGV[4]))
end
-- Read-only checks first, then the writes, the ack last: a write that fails
-- (a key of the wrong type) leaves the entry pending, never lost.
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then
  return 0
end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])[1]
if not e then
  return 0
end
local job = {}
for i = 1, #e[2], 2 do job[e[2][i]] = e[2][i + 1] end
local attempt = tonumber(string.match(job.attempt or '', '^[1-9]%d*$') or '')
if not job.id or job.id == '' or not attempt or attempt >= 1e14
    or not string.match(job.first_enqueued_ms or '', '^%d+$') then
  return redis.error_reply('ERR backstop retry: entry ' .. ARGV[2] .. ' is malformed (needs id and attempt >= 1)')
end
local t = redis.call('TIME')
local due = t[1] * 1000 + math.floor(t[2] / 1000) + delay
local member = cjson.encode({
  id = job.id, attempt = attempt + 1, first_enqueued_ms = job.first_enqueued_ms or '',
  payload = job.payload or '', last_error = ARGV[5] or '', last_reason = ARGV[4], source = ARGV[2],
  prev_delay_ms = delay,
})
redis.call('ZADD', KEYS[2], due, member)
redis.call('HINCRBY', KEYS[3], 'attempts:retry', 1)
redis.call('HINCRBY', KEYS[3], 'retries:' .. ARGV[4], 1)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return due
