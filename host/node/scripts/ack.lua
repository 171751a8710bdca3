-- ack: the job succeeded. XACK and XDEL the entry and count the outcome, in
-- one step. A second ack of the same entry (or an ack after another worker
-- moved it) changes nothing.
-- KEYS[1] jobs stream   KEYS[2] stats hash
-- ARGV[1] consumer group   ARGV[2] entry id
-- Reply: 1 when acked, 0 when the entry was not pending.
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('XDEL', KEYS[1], ARGV[2])
local raw = ''
if e[1] then
  local f = e[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'attempt' then raw = f[i + 1] end
  end
end
-- Counted as a whole number in 1..1e15 whatever the entry says, so a
-- malformed attempt can never fail a write half-way through.
local attempt = math.min(tonumber(string.match(raw, '^[1-9]%d*$') or '1'), 1e15)
local bucket = attempt > 64 and 'inf' or tostring(attempt)
redis.call('HINCRBY', KEYS[2], 'attempts:success', 1)
redis.call('HINCRBY', KEYS[2], 'finished:success:' .. bucket, 1)
redis.call('HINCRBY', KEYS[2], 'finished_sum:success', attempt)
return 1
