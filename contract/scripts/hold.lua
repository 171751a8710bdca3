-- hold: keep entries a consumer holds from being reclaimed, without
-- delivering them again. A worker holds an entry while it retries applying
-- an outcome that Redis refused (out of memory, a read-only replica, a
-- server loading or busy), and the entries it has read but not started:
-- XCLAIM ... JUSTID resets an entry's idle time and leaves its delivery
-- count alone, so reclaim (entries idle for min_idle) passes it by. An entry
-- pending to another consumer is never taken back.
-- Runs under maxmemory with noeviction: XPENDING only reads and XCLAIM is
-- not flagged denyoom, so Redis does not refuse it (ack, retry and
-- dead_letter are refused at their first HINCRBY, ZADD or XADD). Keep it
-- without a shebang: a script that declares flags without allow-oom is
-- refused as a whole when Redis is out of memory.
-- KEYS[1] jobs stream
-- ARGV[1] consumer group   ARGV[2] consumer   ARGV[3..] entry ids (1..1000)
-- Reply: one number per entry id, in order: 1 held (its idle time is now 0),
-- 0 not pending (an outcome was applied, or its data is gone), -1 pending to
-- another consumer (left alone).
if #ARGV < 3 or #ARGV > 1002 or ARGV[2] == '' then
  return redis.error_reply('ERR backstop hold: want a group, a consumer and 1..1000 entry ids')
end
for i = 3, #ARGV do
  if not string.match(ARGV[i], '^%d+%-%d+$') then
    return redis.error_reply('ERR backstop hold: entry id must be a full stream id (ms-seq), got ' .. ARGV[i])
  end
end
-- Read everything first, then write: the checks above and the reads below
-- cannot fail half-way through the claims.
local out, mine = {}, {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)[1]
  if not p then
    out[i - 2] = 0
  elseif p[2] ~= ARGV[2] then
    out[i - 2] = -1
  else
    out[i - 2] = 0
    mine[#mine + 1] = i
  end
end
for _, i in ipairs(mine) do
  -- An entry whose data was deleted is not claimed (Redis drops it from the
  -- pending list): there is nothing left to hold.
  if #redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID') == 1 then
    out[i - 2] = 1
  end
end
return out
