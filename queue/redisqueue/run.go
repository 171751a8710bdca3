package redisqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/backstop-dev/backstop/queue"
)

// MaxRunLimit is the most delayed jobs one Run moves by due time.
const MaxRunLimit = queue.MaxRunLimit

// RunOption selects the delayed jobs Run moves: RunID, or RunDueBefore
// with RunLimit.
type RunOption func(*runArgs)

type runArgs struct {
	id     string
	before time.Time
	byTime bool
	limit  int
	actor  string
}

// RunActor records each job moved in the audit (AuditKey) as run by
// actor (1..256 bytes; default "": nothing recorded).
func RunActor(actor string) RunOption { return func(a *runArgs) { a.actor = actor } }

// RunID selects the delayed job whose job id is id.
func RunID(id string) RunOption { return func(a *runArgs) { a.id = id } }

// RunDueBefore selects the delayed jobs due at or before t, earliest first,
// at most RunLimit of them.
func RunDueBefore(t time.Time) RunOption {
	return func(a *runArgs) { a.before, a.byTime = t, true }
}

// RunLimit bounds how many jobs RunDueBefore moves, 1..MaxRunLimit
// (default 100).
func RunLimit(n int) RunOption { return func(a *runArgs) { a.limit = n } }

// Ran is what Run did.
type Ran struct {
	// Moved counts the jobs moved to the jobs stream (0: the id is not in
	// the delayed set, or nothing is due before the bound).
	Moved int
	// Left counts the jobs still due at or before RunDueBefore's bound
	// (beyond the limit); 0 for RunID.
	Left int
}

// Run moves delayed jobs to the jobs stream now, whatever their due time,
// in one atomic step counted in the stats field force_run, as Cloud Tasks'
// RunTask does once a fix is deployed. Give RunID, or RunDueBefore (with
// RunLimit); a member that is not a job retry wrote moves raw, as Promote
// moves it, for a worker to dead-letter as malformed.
//
// # Notes
//
// The delayed set is ordered by due time: RunID reads every member, O(set
// size), in calls of about 10,000 members (some 20 ms of Redis each) so
// that Redis serves other clients between them.
//
// # Errors
//
// Options that select nothing or two things, or a limit out of range, are
// refused before Redis.
func (q *Queue) Run(ctx context.Context, opts ...RunOption) (Ran, error) {
	a := runArgs{limit: 100}
	for _, o := range opts {
		o(&a)
	}
	keys := []string{q.keys.Delayed, q.keys.Jobs, q.keys.Stats}
	if err := queue.CheckActor(a.actor); err != nil {
		return Ran{}, fmt.Errorf("queue %s: run: %w", q.name, err)
	}
	if a.actor != "" { // each one recorded in the audit (run.lua)
		keys = append(keys, q.AuditKey())
	}
	switch {
	case a.id != "" && a.byTime:
		return Ran{}, fmt.Errorf("queue %s: run: give a job id or a due time bound, not both", q.name)
	case a.id != "":
		// Each call scans a bounded part of the set: Redis serves others
		// between them.
		var r Ran
		for cursor := "0"; ; {
			n, next, done, err := batchReply(scriptRun.Run(ctx, q.rdb, keys, "id", a.id, cursor, a.actor).Slice())
			if err != nil {
				return r, fmt.Errorf("queue %s: run %s: %w", q.name, a.id, err)
			}
			r.Moved, cursor = r.Moved+n, next
			if done {
				return r, nil
			}
		}
	case a.byTime:
		if a.limit < 1 || a.limit > MaxRunLimit {
			return Ran{}, fmt.Errorf("queue %s: run: limit must be in 1..%d, got %d", q.name, MaxRunLimit, a.limit)
		}
		if a.before.UnixMilli() < 0 {
			return Ran{}, fmt.Errorf("queue %s: run: due time bound must not be before 1970, got %s", q.name, a.before)
		}
	default:
		return Ran{}, fmt.Errorf("queue %s: run: give a job id (RunID) or a due time bound (RunDueBefore)", q.name)
	}
	v, err := scriptRun.Run(ctx, q.rdb, keys, "before", a.before.UnixMilli(), a.limit, a.actor).Int64Slice()
	if err != nil || len(v) != 2 {
		return Ran{}, fmt.Errorf("queue %s: run: %w", q.name, errOr(err, "unexpected reply"))
	}
	return Ran{Moved: int(v[0]), Left: int(v[1])}, nil
}
