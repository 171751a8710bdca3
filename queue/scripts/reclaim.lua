-- reclaim: take over entries that crashed consumers left pending for longer
-- than min_idle. An entry delivered max_deliveries times already is a crash
-- loop: it goes to the dead letter stream (reason crash_loop) instead of
-- being delivered again. Pending entries whose data was deleted are acked.
-- KEYS[1] jobs stream   KEYS[2] dlq stream   KEYS[3] stats hash
-- ARGV[1] consumer group   ARGV[2] consumer taking the entries
-- ARGV[3] min idle ms   ARGV[4] count (1..1000)   ARGV[5] max deliveries (>= 1)
-- Reply: {dead-lettered count, claimed entries as XCLAIM returns them...}.
local idle, count, maxd = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local function whole(x) return x and x == math.floor(x) end
if not whole(idle) or idle < 0 or not whole(count) or count < 1 or count > 1000 or not whole(maxd) or maxd < 1 then
  return redis.error_reply('ERR backstop reclaim: want min_idle >= 0, count in 1..1000, max_deliveries >= 1')
end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', idle, '-', '+', count)
local dead, claim = 0, {}
local t = redis.call('TIME')
local now = tostring(t[1] * 1000 + math.floor(t[2] / 1000))
for _, p in ipairs(pending) do
  local id, deliveries = p[1], p[4]
  local e = redis.call('XRANGE', KEYS[1], id, id)[1]
  if not e then
    redis.call('XACK', KEYS[1], ARGV[1], id)
  elseif deliveries >= maxd then
    local job = {}
    for i = 1, #e[2], 2 do job[e[2][i]] = e[2][i + 1] end
    local fields = {'reason', 'crash_loop', 'error', 'delivered ' .. deliveries .. ' times without an outcome',
      'attempt', tostring(job.attempt or ''), 'id', job.id or '', 'source_id', id,
      'first_enqueued_ms', job.first_enqueued_ms or '', 'payload', job.payload or '', 'dead_lettered_ms', now}
    -- As dead_letter: the entry's other fields are kept under "entry.".
    for i = 1, #e[2], 2 do
      local k = e[2][i]
      if k ~= 'id' and k ~= 'attempt' and k ~= 'first_enqueued_ms' and k ~= 'payload' then
        fields[#fields + 1] = 'entry.' .. k
        fields[#fields + 1] = e[2][i + 1]
      end
    end
    redis.call('XADD', KEYS[2], '*', unpack(fields))
    local attempt = math.min(tonumber(string.match(job.attempt or '', '^[1-9]%d*$') or '1'), 1e6)
    local bucket = attempt > 64 and 'inf' or tostring(attempt)
    redis.call('HINCRBY', KEYS[3], 'attempts:dead_letter', 1)
    redis.call('HINCRBY', KEYS[3], 'dead_letters:crash_loop', 1)
    redis.call('HINCRBY', KEYS[3], 'finished:dead_letter:' .. bucket, 1)
    redis.call('HINCRBY', KEYS[3], 'finished_sum:dead_letter', attempt)
    redis.call('XACK', KEYS[1], ARGV[1], id)
    redis.call('XDEL', KEYS[1], id)
    dead = dead + 1
  else
    claim[#claim + 1] = id
  end
end
local out = {dead}
if #claim > 0 then
  local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], idle, unpack(claim))
  for _, c in ipairs(claimed) do out[#out + 1] = c end
  redis.call('HINCRBY', KEYS[3], 'reclaimed', #claimed)
end
return out
