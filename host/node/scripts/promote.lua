-- promote: move at most N due members of the delayed set to the work
-- stream, in one atomic step (no duplicate, no loss if the caller dies
-- between calls). "Due" is by the server's clock. A member that does not
-- decode is still moved, raw, so a worker dead-letters it as malformed.
-- KEYS[1] delayed zset   KEYS[2] jobs stream   KEYS[3] stats hash
-- ARGV[1] limit (1..10000)
-- Reply: {moved, ms until the next member is due or -1 when none is left}.
local limit = tonumber(ARGV[1])
if not limit or limit < 1 or limit > 10000 or limit ~= math.floor(limit) then
  return redis.error_reply('ERR backstop promote: limit must be a whole number in 1..10000, got ' .. tostring(ARGV[1]))
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
for _, m in ipairs(due) do
  local ok, job = pcall(cjson.decode, m)
  if ok and type(job) == 'table' and type(job.id) == 'string' and job.id ~= '' then
    redis.call('XADD', KEYS[2], '*', 'id', tostring(job.id), 'attempt', tostring(job.attempt),
      'first_enqueued_ms', tostring(job.first_enqueued_ms or ''), 'payload', tostring(job.payload or ''),
      'last_error', tostring(job.last_error or ''), 'last_reason', tostring(job.last_reason or ''),
      'prev_delay_ms', string.format('%d', tonumber(job.prev_delay_ms) or 0))
  else
    redis.call('XADD', KEYS[2], '*', 'malformed_delayed_member', m)
  end
  redis.call('ZREM', KEYS[1], m)
end
if #due > 0 then
  redis.call('HINCRBY', KEYS[3], 'promoted', #due)
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if nxt[2] then
  return {#due, math.max(0, tonumber(nxt[2]) - now)}
end
return {#due, -1}
