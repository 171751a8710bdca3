-- replay: move at most N dead letters back to the work stream with the
-- attempt count reset, optionally only those with a given reason, in one
-- atomic step, and count the replays. Scans at most scan entries from the
-- cursor so a filtered replay stays bounded; call again with the cursor it
-- returns until it returns "0".
-- KEYS[1] dlq stream   KEYS[2] jobs stream   KEYS[3] stats hash
-- ARGV[1] limit (1..10000)   ARGV[2] reason ('' for any)   ARGV[3] cursor ('-' or '0' to start)
-- ARGV[4] scan (limit..100000)
-- Reply: {replayed, next cursor or "0" when the stream is exhausted}.
local limit, scan = tonumber(ARGV[1]), tonumber(ARGV[4])
if not limit or limit ~= math.floor(limit) or limit < 1 or limit > 10000 or not scan or scan < limit or scan > 100000 then
  return redis.error_reply('ERR backstop replay: want limit in 1..10000 and scan in limit..100000')
end
local cursor = ARGV[3]
if cursor == '0' or cursor == '' then cursor = '-' end
local entries = redis.call('XRANGE', KEYS[1], cursor, '+', 'COUNT', scan)
local moved, last = 0, nil
for _, e in ipairs(entries) do
  if moved >= limit then break end
  last = e[1]
  local job = {}
  for i = 1, #e[2], 2 do job[e[2][i]] = e[2][i + 1] end
  -- A dead letter without a job id (a malformed entry, its body under
  -- entry.*) stays in the DLQ for a person: replaying it would lose it.
  if (ARGV[2] == '' or job.reason == ARGV[2]) and job.id and job.id ~= '' then
    local t = redis.call('TIME')
    redis.call('XADD', KEYS[2], '*', 'id', job.id or '', 'attempt', '1',
      'first_enqueued_ms', tostring(t[1] * 1000 + math.floor(t[2] / 1000)),
      'payload', job.payload or '', 'replayed_from', e[1], 'last_reason', job.reason or '')
    redis.call('XDEL', KEYS[1], e[1])
    moved = moved + 1
  end
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[3], 'replayed', moved)
end
if #entries < scan and (last == nil or last == entries[#entries][1]) then
  return {moved, '0'}
end
return {moved, '(' .. last}
