package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-dev/backstop"
)

// What a broker offers the CLI, the demo and the exporter, whatever it is
// (docs/layout.md, "Adding a broker"): a Broker opens a Queue per name, and
// a Queue enqueues, works, reports and runs the DLQ workflow. Each broker
// package implements it (redisqueue.Broker, rabbitmq.Broker) beside its own
// richer API, and passes queuetest.Run against a real server.

// Broker is a connection to one broker, which opens its queues by name.
type Broker interface {
	// Kind names the broker in errors and logs: "redis", "rabbitmq".
	Kind() string
	// Open returns the queue called name. It touches no server: a name
	// the broker cannot take is refused (wrapped with the name), a queue
	// that does not exist shows at its first operation.
	Open(name string) (Queue, error)
	// Close releases the connection (and every queue opened on it).
	Close() error
}

// Queue is one queue on a Broker: its parts' names, and every operation.
// Errors are wrapped with the queue's name and carry no credentials.
type Queue interface {
	// Name is the queue's name, as given to Open.
	Name() string
	// Names are where the queue's parts live, as its broker names them.
	Names() Names
	Producer
	Consumer
	Inspector
	Operator
}

// Producer adds jobs to a queue.
type Producer interface {
	// Enqueue adds job id (its stable identity, the idempotency key) with
	// payload. It returns the broker's id of the new message, "" when the
	// broker gives none (RabbitMQ).
	Enqueue(ctx context.Context, id string, payload []byte, o EnqueueOptions) (string, error)
}

// Consumer works a queue.
type Consumer interface {
	// Work runs h on the queue's jobs, decided by p, until ctx is done;
	// it returns nil then, or at once an error for options it refuses.
	Work(ctx context.Context, p backstop.Decider, h Handler, o WorkOptions) error
}

// Inspector reads a queue's figures and dead letters, moving nothing.
type Inspector interface {
	Stats(ctx context.Context) (Stats, error)
	Inspect(ctx context.Context, o InspectOptions) (DLQReport, error)
	// Page reads one page of the DLQ from a cursor, filtered, looking at
	// no more than o.Scan dead letters whatever the DLQ's size.
	Page(ctx context.Context, o PageOptions) (DLQPage, error)
}

// Operator is the operator's workflow: dead letters replayed or discarded
// (each discard recorded in the audit, and each replay and run when given
// an actor), delayed jobs run now.
type Operator interface {
	// Replay moves dead letters back to the queue they came from and
	// returns how many moved (also with an error: those moved before it).
	Replay(ctx context.Context, o ReplayOptions) (int, error)
	// Discard removes dead letters for good, each recorded first in the
	// queue's audit (Names().Audit); it returns how many went.
	Discard(ctx context.Context, o DiscardOptions) (int, error)
	// Run moves delayed jobs to the jobs now, whatever their due time.
	Run(ctx context.Context, o RunOptions) (RunResult, error)
	// Audit reads the newest records of the queue's audit (Names().Audit),
	// at most limit (1..MaxAuditRead), newest first.
	Audit(ctx context.Context, limit int) ([]AuditRecord, error)
}

// MaxAuditRead is the most audit records one Audit returns.
const MaxAuditRead = 1000

// AuditRecord is one write as the audit keeps it: a dead letter discarded
// (DiscardDelete, DiscardPurge) or replayed (AuditReplay), a delayed job
// run now (AuditRun).
type AuditRecord struct {
	Action DiscardAction
	Note   string
	Actor  string
	At     time.Time // zero: unknown
	JobID  string
	Reason string // the dead letter's
}

// Names are where a queue's parts live, as its broker names them; "" for a
// part the broker does not have. Tests and messages read them here rather
// than build them: each broker package owns its names.
type Names struct {
	Jobs    string `json:"jobs"`    // the work (Redis {Q}:jobs; RabbitMQ Q)
	Delayed string `json:"delayed"` // the cold retries (Redis {Q}:delayed; RabbitMQ the exchange Q.delay they enter by)
	DLQ     string `json:"dlq"`     // the dead letters
	Stats   string `json:"stats"`   // the counters ("" on RabbitMQ, which keeps none)
	Audit   string `json:"audit"`   // the discarded dead letters' record
}

// ErrUnsupported is what an operation a broker cannot do returns, wrapped
// with the queue's and the broker's names: errors.Is(err, ErrUnsupported).
var ErrUnsupported = errors.New("not supported")

// Unsupported returns the error of operation op that broker cannot do on
// queue name, why saying what to do instead (or "").
func Unsupported(broker, name, op, why string) error {
	if why != "" {
		why = ": " + why
	}
	return fmt.Errorf("queue %s: %s: %w by %s%s", name, op, ErrUnsupported, broker, why)
}

// EnqueueOptions describe one job to enqueue.
type EnqueueOptions struct {
	// Type is the job type ("": untyped); see ValidJobType.
	Type string
	// Delay makes the first attempt wait; a broker that cannot delay an
	// enqueue returns ErrUnsupported for a Delay above 0.
	Delay time.Duration
}

// WorkOptions are what every broker's worker takes; each broker's own
// tuning (batches, prefetch, promote and reclaim loops) is set where the
// Broker is made.
type WorkOptions struct {
	// Concurrency is how many jobs run at once (0: the broker's default).
	Concurrency int
	// HandlerTimeout bounds each run of the handler (0: the broker's
	// default), as WithHandlerTimeout.
	HandlerTimeout time.Duration
	// Logger is the worker's logger (nil: the broker's).
	Logger *slog.Logger
	// Metrics and PolicyName count the worker's outcomes, as WithMetrics
	// (nil: none).
	Metrics    prometheus.Registerer
	PolicyName string
	// Policies decide the jobs of some types by their own policy, as
	// WithPolicies.
	Policies map[string]backstop.Decider
	// OnOutcome is told of every outcome the worker applies, as
	// WithOutcomeHook (nil: none).
	OnOutcome OutcomeHook
}

// Stats are a queue's figures, read live. Raw is the broker's own report,
// richer, as its package returns it.
type Stats struct {
	// Jobs are the jobs waiting or held by a worker.
	Jobs int64
	// Held are the jobs a worker holds, not yet settled (Redis: pending;
	// RabbitMQ: unacked); nil when the broker cannot say.
	Held *int64
	// Delayed are the jobs waiting for a retry; nil when the broker cannot
	// count one queue's (RabbitMQ's delay levels are shared).
	Delayed *int64
	// DeadLetters is the DLQ's size.
	DeadLetters int64
	// Counters are the broker's own counters by name (Redis: the stats
	// hash, e.g. "dead_letters:permanent_error"); nil when it keeps none.
	Counters map[string]int64
	// Found reports that some part of the queue exists: false for a
	// misspelt name on a broker where a missing queue reads as empty.
	Found bool
	// Raw is the broker's report (redisqueue.Stats, rabbitmq.Stats).
	Raw any
}

// ScanDefault lets the broker choose how many dead letters Inspect counts.
const ScanDefault = -1

// InspectOptions bound an Inspect.
type InspectOptions struct {
	// Letters is how many dead letters to list: the newest on a broker
	// that reads its DLQ from either end (Redis), else the oldest.
	Letters int
	// Scan is the most dead letters counted by reason (ScanDefault: the
	// broker's default, Redis 100,000, RabbitMQ 1,000: each a round trip).
	Scan int64
}

// DLQReport is what Inspect saw.
type DLQReport struct {
	Size     int64            // dead letters in the DLQ
	Scanned  int64            // those counted by reason
	ByReason map[string]int64 // the counted ones, by reason
	Letters  []DLQEntry       // InspectOptions.Letters of them
	Newest   bool             // Letters are the newest, newest first; else the oldest, oldest first
	Raw      any              // the broker's report (redisqueue.DLQReport; RabbitMQ's dead letters)
}

// Reasons returns the report's reasons, most frequent first.
func (r DLQReport) Reasons() []string {
	out := make([]string, 0, len(r.ByReason))
	for k := range r.ByReason {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if r.ByReason[out[i]] != r.ByReason[out[j]] {
			return r.ByReason[out[i]] > r.ByReason[out[j]]
		}
		return out[i] < out[j]
	})
	return out
}

// DLQEntry is one dead letter as Inspect lists it.
type DLQEntry struct {
	EntryID string // the broker's id of the message ("" when it has none)
	JobID   string
	Type    string // the job type ("": untyped)
	Attempt string // as the broker holds it: a malformed one shows
	Reason  string
	Error   string // the last error
}

// ReplayOptions select the dead letters Replay moves and how.
type ReplayOptions struct {
	// Limit is the most dead letters moved: required (at least 1) unless ID
	// is given; 0 with an ID = every dead letter of that job.
	Limit int
	// Reason, JobType and ID move only the dead letters with this reason,
	// of this job type, of this job id ("" = any).
	Reason, JobType, ID string
	// KeepAttempts keeps each dead letter's attempt and first-enqueued
	// time (the time budget) instead of starting the job afresh.
	KeepAttempts bool
	// Rate paces the replay: at most Rate dead letters a second on
	// average, in batches (Pacer); 0 = unpaced.
	Rate float64
	// Actor is who replays (0..MaxActorLen bytes): when set, each dead
	// letter replayed is recorded in the queue's audit (Names().Audit) with
	// action AuditReplay; "" records nothing (the CLI and the console
	// always set it).
	Actor string
}

// DiscardOptions select the dead letters Discard removes and say why.
type DiscardOptions struct {
	// Action is DiscardDelete (ID required) or DiscardPurge.
	Action DiscardAction
	// ID, Reason and JobType discard only the dead letters of this job
	// id, with this reason, of this job type ("" = any).
	ID, Reason, JobType string
	// Limit is the most dead letters discarded; 0 = every one that matches.
	Limit int
	// Note is why (1..MaxNoteLen bytes) and Actor who (1..MaxActorLen),
	// both required, recorded with each one.
	Note, Actor string
}

// MaxRunLimit is the most delayed jobs one Run moves by due time.
const MaxRunLimit = 10000

// RunOptions select the delayed jobs Run moves: ID, or DueBefore with
// Limit (1..MaxRunLimit).
type RunOptions struct {
	// ID runs the delayed job with this job id.
	ID string
	// DueBefore runs the delayed jobs due at or before it, earliest first,
	// at most Limit of them.
	DueBefore time.Time
	Limit     int
	// Actor is who runs them (0..MaxActorLen bytes): when set, each job
	// moved is recorded in the queue's audit with action AuditRun; ""
	// records nothing.
	Actor string
}

// RunResult is what Run did.
type RunResult struct {
	Moved int // jobs moved to the jobs (0: the id is not delayed, or nothing is due)
	Left  int // jobs still due before DueBefore, beyond the limit
}
