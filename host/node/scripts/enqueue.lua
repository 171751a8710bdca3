-- enqueue: add a job to the work stream, stamped with the server's clock.
-- KEYS[1] jobs stream   KEYS[2] stats hash
-- ARGV[1] job id (stable: the idempotency key)   ARGV[2] payload
-- Reply: the new entry id.
if ARGV[1] == nil or ARGV[1] == '' then
  return redis.error_reply('ERR backstop enqueue: job id must not be empty')
end
local t = redis.call('TIME')
local now = tostring(t[1] * 1000 + math.floor(t[2] / 1000))
local entry = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'attempt', '1',
  'first_enqueued_ms', now, 'payload', ARGV[2] or '')
redis.call('HINCRBY', KEYS[2], 'enqueued', 1)
return entry
