-- run: move delayed jobs to the work stream now, before they are due, in
-- one atomic step, counted in force_run (Cloud Tasks' RunTask, say once a
-- fix is deployed). A member moves as promote moves it: as the job
-- retry.lua wrote when nothing of it can be lost, else raw, byte for byte,
-- so a worker dead-letters it as malformed.
-- KEYS[1] delayed zset   KEYS[2] jobs stream   KEYS[3] stats hash
-- ARGV[1] mode: "id" or "before"
--   id:     ARGV[2] job id (not empty), ARGV[3] cursor ("0" to start, then
--           the one the last call returned). Every member whose JSON has
--           this id moves (a job is in the set once; a duplicate enqueue of
--           one id is the same job). The set is ordered by due time, not by
--           id: each call reads about 10,000 members (ZSCAN with MATCH, 10
--           steps of COUNT 1000), so that no call blocks Redis for long; call
--           again with the cursor until it is "0". ZSCAN returns every member
--           that stays in the set for the whole scan, whatever moves between
--           calls. The cursor carries when the scan began (<zscan>@<ms>,
--           server time): a member written after that stays (promote moved
--           the job meanwhile, a worker ran it and retried or deferred it),
--           so that a job promoted around the run is not run a second time
--           by it. Written after: its source (the stream entry it came
--           from) was added after, or retry wrote it after (its last_reason
--           a retry's, and its due time minus prev_delay_ms, the time retry
--           wrote it, after).
--   before: ARGV[2] due time bound (unix ms, 0..2^53-1), ARGV[3] limit
--           (1..10000): the at most limit members due at or before the
--           bound, earliest first, even when not due yet.
-- Reply: id: {moved, next cursor or "0" when the scan is done}; before:
-- {moved, members still due at or before the bound}. An id not in the set
-- moves nothing: {0, "0"} at the end of the scan.
-- KEYS[4] audit stream (optional) and ARGV[4] actor (who: 1..256 bytes,
-- required with KEYS[4]): each job moved is recorded in the audit after
-- its move (a script that has written is not stopped by a full memory):
-- action "run", actor, at_ms (server TIME), id and reason (its last one),
-- XADD MAXLEN ~ 10000. Without KEYS[4] nothing is recorded.
-- All or nothing (README.md), member by member: the checks only read; each
-- member's XADD is its first write, and a failed one ends the batch (an
-- error when it was the first).
-- The helpers (show, wrong_type, counters, job_fields, ...) are lib.lua's,
-- sent before this script as one body.
local function refuse(msg) return redis.error_reply('ERR backstop run: ' .. msg) end

if (#KEYS ~= 3 and #KEYS ~= 4) or KEYS[1] == KEYS[2] or KEYS[1] == KEYS[3] or KEYS[2] == KEYS[3]
    or (KEYS[4] and (KEYS[4] == KEYS[1] or KEYS[4] == KEYS[2] or KEYS[4] == KEYS[3])) then
  return refuse('want 3 or 4 distinct keys: delayed, jobs, stats[, audit]')
end
local audit, actor = KEYS[4], ARGV[4] or ''
if audit and (#actor < 1 or #actor > 256) then
  return refuse('actor must be 1..256 bytes, got ' .. #actor)
end
local mode, members, bound, cursor, began = ARGV[1], {}, nil, ARGV[3], nil
if mode == 'id' then
  if not ARGV[2] or ARGV[2] == '' then return refuse('job id must not be empty') end
  local zc, at = string.match(cursor or '', '^(%d+)@(%d+)$')
  if zc and u64(zc) and whole(at, 0, 9007199254740991) then
    cursor, began = zc, whole(at, 0, 9007199254740991)
  elseif cursor ~= '0' then
    return refuse('cursor must be "0" or a cursor run returned, got ' .. show(cursor))
  end
elseif mode == 'before' then
  bound = whole(ARGV[2], 0, 9007199254740991)
  if not bound then
    return refuse('due time bound must be a whole number of unix ms in 0..2^53-1, got ' .. show(ARGV[2]))
  end
  if not whole(ARGV[3], 1, 10000) then
    return refuse('limit must be a whole number in 1..10000, got ' .. show(ARGV[3]))
  end
else
  return refuse('mode must be "id" or "before", got ' .. show(mode))
end
local err = wrong_type(KEYS[1], 'zset') or wrong_type(KEYS[2], 'stream')
  or (audit and wrong_type(audit, 'stream'))
if err then return refuse(err) end
if mode == 'id' then
  -- retry.lua writes the id with cjson, so the member holds this text; a
  -- quote inside a JSON string is escaped, so it cannot match there. The
  -- match only selects candidates: the decoded id decides.
  local glob = '*"id":' .. string.gsub(cjson.encode(ARGV[2]), '[%*%?%[%]\\]', '\\%0') .. '*'
  -- The first call begins the scan; a later one leaves the members
  -- written since: one whose source (the stream entry it came from) was
  -- added since, or one retry wrote (its reason a retry's) since, as its
  -- due time minus its delay (prev_delay_ms) says. Both are in whole ms,
  -- so the millisecond the scan began counts as since: a job promoted and
  -- retried in it is not run a second time (one written in it just before
  -- the scan may be left, which a second run moves).
  local later = began ~= nil
  began = began or now_ms()
  local RETRIED = {transient = true, retry_after = true, uncertain = true}
  local function since(job, score)
    if not later then return false end
    local ms = type(job.source) == 'string' and entry_id(job.source) and string.match(job.source, '^(%d+)%-')
    if ms and (#ms > 16 or tonumber(ms) >= began) then return true end
    return RETRIED[job.last_reason] == true and type(job.prev_delay_ms) == 'number'
      and tonumber(score) - job.prev_delay_ms >= began
  end
  local seen = {}
  for _ = 1, 10 do
    local r = redis.call('ZSCAN', KEYS[1], cursor, 'MATCH', glob, 'COUNT', 1000)
    cursor = r[1]
    for i = 1, #r[2], 2 do
      local m = r[2][i]
      local ok, job = pcall(cjson.decode, m)
      if not seen[m] and ok and type(job) == 'table' and job.id == ARGV[2] and not since(job, r[2][i + 1]) then
        seen[m] = true
        members[#members + 1] = m
      end
    end
    if cursor == '0' then break end
  end
else
  members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', bound, 'LIMIT', 0, ARGV[3])
end
local c = counters()
if #members > 0 then add(c, 'force_run', #members) end
err = bad_counters(KEYS[3], c)
if err then return refuse(err) end
local moved, refused = move_members(KEYS[1], KEYS[2], members, refuse)
if refused then return refused end
if moved > 0 then c.n.force_run = moved end
count(KEYS[3], c)
if audit then
  local at = string.format('%d', now_ms())
  for i = 1, moved do
    local ok, job = pcall(cjson.decode, members[i])
    if not ok or type(job) ~= 'table' then job = {} end
    audit_add(audit, {'action', 'run', 'actor', actor, 'at_ms', at,
      'id', type(job.id) == 'string' and job.id or '', 'reason', type(job.last_reason) == 'string' and job.last_reason or ''})
  end
end
if bound then return {moved, redis.call('ZCOUNT', KEYS[1], '-inf', bound)} end
-- A batch cut short by a failed XADD: scan the same part again.
if moved < #members then cursor = ARGV[3] == '0' and '0' or string.match(ARGV[3], '^%d+') end
if cursor == '0' and moved == #members then return {moved, '0'} end
return {moved, cursor .. '@' .. string.format('%d', began)}
