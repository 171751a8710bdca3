-- discard: remove dead letters from the DLQ for good (an operator's delete
-- or purge), each one first recorded in the bounded audit stream with who
-- discarded it, when and why, in one atomic step, and count the discards.
-- Scans at most scan entries from the cursor so that a filtered discard
-- stays bounded; call again with the cursor it returns until it returns "0".
-- A pass (the calls from '-' to "0") ends at the dead letter that was last
-- when it started: one that workers add meanwhile is not discarded by it.
-- KEYS[1] dlq stream   KEYS[2] audit stream   KEYS[3] stats hash
-- ARGV[1] action ('delete' or 'purge')
-- ARGV[2] note (the operator's reason: 1..1024 bytes)
-- ARGV[3] actor (who: 1..256 bytes, e.g. user@host)
-- ARGV[4] limit (1..10000)
-- ARGV[5] cursor ('-', '0' or '' to start, else one this script returned)
-- ARGV[6] scan (limit..100000)
-- ARGV[7] dead letter reason ('' for any)
-- ARGV[8] job type ('' for any)
-- ARGV[9] job id ('' for any; required for delete)
-- Reply: {discarded, next cursor or "0" when the pass is done}.
-- Each audit entry: action, note, actor, at_ms (server TIME), then the dead
-- letter's own fields as they are (a dead letter of more than 2000 fields:
-- all of them in one field, dead_letter_fields, a JSON array [name, value,
-- ...]), XADD MAXLEN ~ 10000: the audit keeps about the last 10,000.
-- All or nothing (README.md), dead letter by dead letter: the checks only
-- read; each one's XADD to the audit is its first write, and a failed one
-- ends the batch (an error when it was the first).
-- The helpers (show, wrong_type, counters, ...) are lib.lua's, sent before
-- this script as one body.
local function refuse(msg) return redis.error_reply('ERR backstop discard: ' .. msg) end

if #KEYS ~= 3 or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3] then
  return refuse('want 3 distinct keys: dlq, audit, stats')
end
local action = ARGV[1]
if action ~= 'delete' and action ~= 'purge' then
  return refuse('action must be "delete" or "purge", got ' .. show(action))
end
local note, actor = ARGV[2] or '', ARGV[3] or ''
if #note < 1 or #note > 1024 then
  return refuse('note (the reason for the discard) must be 1..1024 bytes, got ' .. #note)
end
if #actor < 1 or #actor > 256 then
  return refuse('actor must be 1..256 bytes, got ' .. #actor)
end
local limit = whole(ARGV[4], 1, 10000)
local scan = limit and whole(ARGV[6], limit, 100000)
if not limit or not scan then
  return refuse('want limit in 1..10000 and scan in limit..100000, got ' .. show(ARGV[4]) .. ', ' .. show(ARGV[6]))
end
local reason = ARGV[7] or ''
if reason ~= '' and not reason_ok(reason) then
  return refuse('reason must be "" (any) or 1..128 printable ASCII characters without spaces, got ' .. show(reason))
end
local jtype = ARGV[8] or ''
if jtype ~= '' and not type_ok(jtype) then
  return refuse('type must be "" (any) or 1..64 bytes of [A-Za-z0-9_./-], got ' .. show(jtype))
end
local jid = ARGV[9] or ''
if action == 'delete' and jid == '' then
  return refuse('delete needs a job id')
end
-- XRANGE would read "5000" as 5000-0, "+" as the end: only a start or a
-- cursor as returned below, which carries the end of the pass.
local cursor, stop = dlq_pass(ARGV[5])
if not cursor then
  return refuse('cursor must be "-", "0" or a cursor discard returned, got ' .. show(ARGV[5]))
end
local err = wrong_type(KEYS[1], 'stream') or wrong_type(KEYS[2], 'stream')
if err then return refuse(err) end
-- A pass ends at the DLQ's last entry when it started (lib.lua's dlq_pass).
stop = stop or dlq_end(KEYS[1])
local entries = stop and redis.call('XRANGE', KEYS[1], cursor, stop, 'COUNT', scan) or {}
-- Plan first: which dead letters go, so that the counter is checked for
-- the most that can.
local plan, last = {}, nil
for _, e in ipairs(entries) do
  if #plan >= limit then break end
  last = e[1]
  local dl = {}
  for i = 1, #e[2], 2 do dl[e[2][i]] = e[2][i + 1] end
  -- Unlike replay, a dead letter without a job id (a malformed entry) can
  -- be purged: the audit keeps its every field.
  if (reason == '' or dl.reason == reason) and (jtype == '' or dl.type == jtype)
      and (jid == '' or dl.id == jid) then
    plan[#plan + 1] = e
  end
end
local c = counters()
if #plan > 0 then add(c, 'discarded', #plan) end
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
local at = string.format('%d', now_ms())
local moved = 0
for _, e in ipairs(plan) do
  local fields = {'action', action, 'note', note, 'actor', actor, 'at_ms', at}
  if #e[2] > 4000 then
    fields[#fields + 1] = 'dead_letter_fields'
    fields[#fields + 1] = cjson.encode(e[2])
  else
    for i = 1, #e[2] do fields[#fields + 1] = e[2][i] end
  end
  local id, failed = audit_add(KEYS[2], fields)
  if not id then
    if moved == 0 then return xadd_refused(refuse, KEYS[2], failed) end
    -- Resume after the last one that went.
    last = plan[moved][1]
    break
  end
  redis.call('XDEL', KEYS[1], e[1])
  moved = moved + 1
end
if moved > 0 then c.n.discarded = moved end
count(KEYS[3], c)
if moved == #plan and (last == stop or (#entries < scan and (last == nil or last == entries[#entries][1]))) then
  return {moved, '0'}
end
return {moved, '(' .. last .. '..' .. stop}
