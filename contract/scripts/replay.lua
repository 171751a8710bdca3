-- replay: move at most N dead letters back to the work stream with the
-- attempt count reset (or kept), optionally only those with a given reason,
-- type or job id, in one atomic step, and count the replays. Scans at most scan entries from the
-- cursor so a filtered replay stays bounded; call again with the cursor it
-- returns until it returns "0". A pass (the calls from '-' to "0") ends at
-- the dead letter that was last when it started: one that workers add
-- meanwhile (a replayed job failing again) waits for the next pass, so a
-- pass replays each job at most once and always ends.
-- KEYS[1] dlq stream   KEYS[2] jobs stream   KEYS[3] stats hash
-- ARGV[1] limit (1..10000)   ARGV[2] reason ('' for any)
-- ARGV[3] cursor ('-', '0' or '' to start, else one this script returned)
-- ARGV[4] scan (limit..100000)
-- ARGV[5] job type (optional; '' or absent for any): only dead letters of
-- this type
-- ARGV[6] keep attempts (optional; '1' keeps the dead letter's attempt and
-- first_enqueued_ms, '' / '0' / absent resets them): a dead letter whose
-- attempt or first_enqueued_ms is not well-formed then stays in the DLQ
-- ARGV[7] job id (optional; '' or absent for any): only dead letters of
-- this job
-- KEYS[4] audit stream (optional) and ARGV[8] actor (who: 1..256 bytes,
-- required with KEYS[4]): each dead letter replayed is first recorded in
-- the audit, as discard records its own: action "replay", actor, at_ms
-- (server TIME), id, reason, type (when it has one) and dlq_entry (the
-- dead letter's entry id), XADD MAXLEN ~ 10000. Without KEYS[4] nothing
-- is recorded (the SDKs' replays until they pass one).
-- Reply: {replayed, next cursor or "0" when the pass is done}.
-- All or nothing (README.md), dead letter by dead letter: the checks only
-- read; each one's XADD is its first write, and a failed one ends the batch
-- (an error when it was the first).
-- The helpers (show, wrong_type, counters, ...) are lib.lua's, sent before
-- this script as one body.
local function refuse(msg) return redis.error_reply('ERR backstop replay: ' .. msg) end

if (#KEYS ~= 3 and #KEYS ~= 4) or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3]
    or (KEYS[4] and (KEYS[4] == KEYS[1] or KEYS[4] == KEYS[2] or KEYS[4] == KEYS[3])) then
  return refuse('want 3 or 4 distinct keys: dlq, jobs, stats[, audit]')
end
local audit, actor = KEYS[4], ARGV[8] or ''
if audit and (#actor < 1 or #actor > 256) then
  return refuse('actor must be 1..256 bytes, got ' .. #actor)
end
local limit = whole(ARGV[1], 1, 10000)
local scan = limit and whole(ARGV[4], limit, 100000)
if not limit or not scan then
  return refuse('want limit in 1..10000 and scan in limit..100000, got ' .. show(ARGV[1]) .. ', ' .. show(ARGV[4]))
end
local reason = ARGV[2] or ''
if reason ~= '' and not reason_ok(reason) then
  return refuse('reason must be "" (any) or 1..128 printable ASCII characters without spaces, got ' .. show(reason))
end
local jtype = ARGV[5] or ''
if jtype ~= '' and not type_ok(jtype) then
  return refuse('type must be "" (any) or 1..64 bytes of [A-Za-z0-9_./-], got ' .. show(jtype))
end
-- XRANGE would read "5000" as 5000-0, "+" as the end: only a start or a
-- cursor as returned below, which carries the end of the pass.
local cursor, stop = dlq_pass(ARGV[3])
if not cursor then
  return refuse('cursor must be "-", "0" or a cursor replay returned, got ' .. show(ARGV[3]))
end
local keep = ARGV[6] or ''
if keep ~= '' and keep ~= '0' and keep ~= '1' then
  return refuse('keep attempts must be "1", "0" or "", got ' .. show(ARGV[6]))
end
keep = keep == '1'
local jid = ARGV[7] or ''
local err = wrong_type(KEYS[1], 'stream') or wrong_type(KEYS[2], 'stream')
  or (audit and wrong_type(audit, 'stream'))
if err then return refuse(err) end
-- A pass ends at the DLQ's last entry when it started (lib.lua's dlq_pass).
stop = stop or dlq_end(KEYS[1])
local entries = stop and redis.call('XRANGE', KEYS[1], cursor, stop, 'COUNT', scan) or {}
-- Plan first: which dead letters move, so that the counter is checked for
-- the most that can.
local plan, last = {}, nil
for _, e in ipairs(entries) do
  if #plan >= limit then break end
  last = e[1]
  local job = {}
  for i = 1, #e[2], 2 do job[e[2][i]] = e[2][i + 1] end
  -- A dead letter without a job id (a malformed entry, its body under
  -- entry.*) stays in the DLQ for a person: replaying it would lose it.
  -- Kept attempts must be what a worker reads as a job: 1..1e14-1 and
  -- digits (as job_of), or the replay would only make a malformed entry.
  local kept = not keep or (string.find(job.attempt or '', '^[1-9]%d*$') and #job.attempt <= 14
      and string.find(job.first_enqueued_ms or '', '^%d+$'))
  if (reason == '' or job.reason == reason) and (jtype == '' or job.type == jtype)
      and (jid == '' or job.id == jid) and job.id and job.id ~= '' and kept then
    plan[#plan + 1] = {e[1], job}
  end
end
local c = counters()
if #plan > 0 then add(c, 'replayed', #plan) end
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
local at = string.format('%d', now_ms())
local moved = 0
for _, p in ipairs(plan) do
  local job = p[2]
  -- The audit record first: when Redis is out of memory it refuses a
  -- script's first write, so the batch ends with nothing unrecorded.
  local rec
  if audit then
    local fields = {'action', 'replay', 'actor', actor, 'at_ms', at, 'id', job.id,
      'reason', job.reason or '', 'dlq_entry', p[1]}
    if job.type then
      fields[#fields + 1] = 'type'
      fields[#fields + 1] = job.type
    end
    local failed
    rec, failed = audit_add(audit, fields)
    if not rec then
      if moved == 0 then return xadd_refused(refuse, audit, failed) end
      last = plan[moved][1]
      break
    end
  end
  local attempt, first = '1', string.format('%d', now_ms())
  if keep then attempt, first = job.attempt, job.first_enqueued_ms end
  local fields = {'id', job.id, 'attempt', attempt,
    'first_enqueued_ms', first,
    'payload', job.payload or '', 'replayed_from', p[1], 'last_reason', job.reason or ''}
  if job.type then
    fields[#fields + 1] = 'type'
    fields[#fields + 1] = job.type
  end
  local id, failed = xadd(KEYS[2], fields)
  if not id then
    -- Not replayed: no record of it.
    if rec then redis.call('XDEL', audit, rec) end
    if moved == 0 then return xadd_refused(refuse, KEYS[2], failed) end
    -- Resume after the last one that moved.
    last = plan[moved][1]
    break
  end
  redis.call('XDEL', KEYS[1], p[1])
  moved = moved + 1
end
if moved > 0 then c.n.replayed = moved end
count(KEYS[3], c)
if moved == #plan and (last == stop or (#entries < scan and (last == nil or last == entries[#entries][1]))) then
  return {moved, '0'}
end
return {moved, '(' .. last .. '..' .. stop}
