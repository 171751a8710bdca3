-- idempotency: the server side of idempotency keys (README.md,
-- "Idempotency keys"): one record per key, in one atomic step per call.
-- KEYS[1] the record, a hash: state (in_progress or completed), token (the
-- owner's), lease_until (unix ms, server clock), request (a hash of the
-- request), and once completed: status, headers, body (as the adapter
-- encodes them: body base64, headers a JSON object), too_large ('1' when the
-- response was over the adapter's limit: no body, never replayed), and
-- truncated ('1' when the client left before the response was finished: the
-- body is what was captured; absent otherwise).
-- ARGV[1] the operation:
--   begin TOKEN REQUEST LEASE_MS RETENTION_MS
--     absent, or in progress past its lease (the owner crashed): the caller
--     owns the key now: {'started', taken_over (0 or 1)}
--     another request under the key: {'conflict'}
--     in progress: {'in_progress', seconds left of the lease, rounded up}
--     completed: {'completed', status, headers, body, too_large (0 or 1),
--     truncated (0 or 1)}
--   complete TOKEN STATUS HEADERS BODY TOO_LARGE RETENTION_MS [TRUNCATED]
--     the owner stores the response: {'completed'}; TRUNCATED ('0' or '1',
--     default '0'; optional, so an adapter that predates it still calls)
--   fail TOKEN
--     the owner releases the key so that a retry may run: {'released'}
-- complete and fail by anyone but the owner (the lease ran out and another
-- caller took the key over, or the record expired) write nothing and reply
-- the error "ERR backstop idempotency: lease lost: ...": the late owner
-- must not overwrite the second run's result.
-- Errors (nothing written): bad ARGV, or KEYS[1] not a hash.
local function refuse(msg) return redis.error_reply('ERR backstop idempotency: ' .. msg) end
-- A token or a request hash: 1..128 printable ASCII characters, no spaces.
local function word(name, s)
  if not reason_ok(s) then return name .. ' must be 1..128 printable ASCII characters, got ' .. show(s) end
end

if #KEYS ~= 1 then return refuse('want 1 key: the record') end
local op, token = ARGV[1], ARGV[2]
local bad = word('token', token)
if op == 'begin' then
  if #ARGV ~= 5 then return refuse('begin wants 5 arguments: begin token request lease_ms retention_ms') end
  bad = bad or word('request', ARGV[3])
elseif op == 'complete' then
  if #ARGV ~= 7 and #ARGV ~= 8 then
    return refuse('complete wants 7 or 8 arguments: complete token status headers body too_large retention_ms [truncated]')
  end
elseif op == 'fail' then
  if #ARGV ~= 2 then return refuse('fail wants 2 arguments: fail token') end
else
  return refuse('operation must be begin, complete or fail, got ' .. show(op))
end
if bad then return refuse(bad) end
bad = wrong_type(KEYS[1], 'hash')
if bad then return refuse(bad) end
local rec = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'request')
local state, owner, lease_until, request = rec[1], rec[2], tonumber(rec[3] or ''), rec[4]

if op == 'begin' then
  local lease = whole(ARGV[4], 1, 1e10)
  if not lease then return refuse('lease_ms must be a whole number in 1..1e10, got ' .. show(ARGV[4])) end
  local retention = whole(ARGV[5], 1, 1e12)
  if not retention or retention < lease then
    return refuse('retention_ms must be a whole number in lease_ms..1e12, got ' .. show(ARGV[5]))
  end
  local now = now_ms()
  if state and request ~= ARGV[3] then return {'conflict'} end
  if state == 'completed' then
    local r = redis.call('HMGET', KEYS[1], 'status', 'headers', 'body', 'too_large', 'truncated')
    return {'completed', r[1] or '', r[2] or '', r[3] or '', r[4] == '1' and 1 or 0, r[5] == '1' and 1 or 0}
  end
  local taken = 0
  if state == 'in_progress' then
    if lease_until and lease_until > now then
      return {'in_progress', math.ceil((lease_until - now) / 1000)}
    end
    taken = 1
  elseif state then
    return refuse(KEYS[1] .. ' holds state ' .. show(state) .. ', not in_progress or completed')
  end
  -- HSET first (a takeover overwrites all four fields an in-progress
  -- record has): under OOM Redis refuses it and nothing is written.
  redis.call('HSET', KEYS[1], 'state', 'in_progress', 'token', token, 'lease_until', string.format('%d', now + lease),
    'request', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], retention)
  return {'started', taken}
end

if op == 'complete' then
  local status = whole(ARGV[3], 100, 999)
  if not status then return refuse('status must be a whole number in 100..999, got ' .. show(ARGV[3])) end
  if ARGV[6] ~= '0' and ARGV[6] ~= '1' then return refuse('too_large must be 0 or 1, got ' .. show(ARGV[6])) end
  if ARGV[8] and ARGV[8] ~= '0' and ARGV[8] ~= '1' then return refuse('truncated must be 0 or 1, got ' .. show(ARGV[8])) end
  local retention = whole(ARGV[7], 1, 1e12)
  if not retention then return refuse('retention_ms must be a whole number in 1..1e12, got ' .. show(ARGV[7])) end
end
if state ~= 'in_progress' or owner ~= token then
  local why = 'the record is gone (expired or released)'
  if state == 'completed' then why = 'the record is completed'
  elseif state then why = 'another caller owns it now (the lease ran out)' end
  return refuse('lease lost: ' .. KEYS[1] .. ': ' .. why)
end
if op == 'fail' then
  redis.call('DEL', KEYS[1])
  return {'released'}
end
-- The owner completes even past its lease when nobody took the key over:
-- the result is the one run's.
local large = ARGV[6] == '1'
redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[3], 'headers', large and '' or ARGV[4],
  'body', large and '' or ARGV[5], 'too_large', ARGV[6])
redis.call('HDEL', KEYS[1], 'lease_until')
if ARGV[8] == '1' then redis.call('HSET', KEYS[1], 'truncated', '1') end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return {'completed'}
