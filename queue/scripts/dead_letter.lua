-- dead_letter: move a job to the dead letter stream with the reason, the
-- last error and its attempt count, XACK and XDEL the entry, and count it,
-- in one atomic step. Works on malformed entries too: every field of the
-- entry is kept.
-- KEYS[1] jobs stream   KEYS[2] dlq stream   KEYS[3] stats hash
-- ARGV[1] consumer group   ARGV[2] entry id   ARGV[3] reason   ARGV[4] last error
-- Reply: the DLQ entry id, or 0 when the entry was not pending.
if ARGV[3] == nil or ARGV[3] == '' then
  return redis.error_reply('ERR backstop dead_letter: reason must not be empty')
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
-- Counted as a whole number in 1..1e6 (max_attempts' bound) whatever the
-- entry says, so no counter can overflow.
local attempt = math.min(tonumber(string.match(job.attempt or '', '^[1-9]%d*$') or '1'), 1e6)
local t = redis.call('TIME')
local fields = {'reason', ARGV[3], 'error', ARGV[4] or '',
  'attempt', tostring(job.attempt or ''), 'id', job.id or '', 'source_id', ARGV[2],
  'first_enqueued_ms', job.first_enqueued_ms or '', 'payload', job.payload or '',
  'dead_lettered_ms', tostring(t[1] * 1000 + math.floor(t[2] / 1000))}
-- Keep every other field of the entry too (a malformed one's whole body),
-- under an "entry." prefix so it cannot clash with the fields above.
local known = {id = 1, attempt = 1, first_enqueued_ms = 1, payload = 1}
for i = 1, #e[2], 2 do
  if not known[e[2][i]] then
    fields[#fields + 1] = 'entry.' .. e[2][i]
    fields[#fields + 1] = e[2][i + 1]
  end
end
local id = redis.call('XADD', KEYS[2], '*', unpack(fields))
local bucket = attempt > 64 and 'inf' or tostring(attempt)
redis.call('HINCRBY', KEYS[3], 'attempts:dead_letter', 1)
redis.call('HINCRBY', KEYS[3], 'dead_letters:' .. ARGV[3], 1)
redis.call('HINCRBY', KEYS[3], 'finished:dead_letter:' .. bucket, 1)
redis.call('HINCRBY', KEYS[3], 'finished_sum:dead_letter', attempt)
if ARGV[3] == 'max_attempts_reached' then
  redis.call('HINCRBY', KEYS[3], 'max_attempts_reached', 1)
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return id
