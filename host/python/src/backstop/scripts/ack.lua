-- ack: the job succeeded. XACK and XDEL the entry and count the outcome, in
-- one step. A second ack of the same entry (or an ack after another worker
-- moved it) changes nothing.
-- KEYS[1] jobs stream   KEYS[2] stats hash
-- ARGV[1] consumer group   ARGV[2] entry id
-- Reply: 1 when acked, 0 when the entry was not pending.
-- Read-only checks first, then the counters, then the ack: a write that
-- fails (a key of the wrong type) leaves the entry pending, never half-moved.
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then
  return 0
end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
local raw = ''
if e[1] then
  local f = e[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'attempt' then raw = f[i + 1] end
  end
end
-- Counted as a whole number in 1..1e6 (max_attempts' bound) whatever the
-- entry says, so no counter can overflow.
local attempt = math.min(tonumber(string.match(raw, '^[1-9]%d*$') or '1'), 1e6)
local bucket = attempt > 64 and 'inf' or tostring(attempt)
redis.call('HINCRBY', KEYS[2], 'attempts:success', 1)
redis.call('HINCRBY', KEYS[2], 'finished:success:' .. bucket, 1)
redis.call('HINCRBY', KEYS[2], 'finished_sum:success', attempt)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
