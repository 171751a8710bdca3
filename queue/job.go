// Package queue is what every broker's worker shares (DESIGN.md, "The queue
// contract" and "Brokers"): a Job as a handler sees it, the Handler, the
// Outcome a worker applies, and the Runner that decides it the same way on
// every broker: the breaker asked before the job, the handler run within its
// deadline, a success fed to the budget and the breaker, a failure
// classified and decided by the policy, the client metrics counted.
//
// The brokers live beside it: queue/redisqueue (Redis Streams, the
// reference) and queue/rabbitmq. Each reads jobs its own way and applies an
// Outcome through its own atomic moves.
package queue

import (
	"context"
	"fmt"
	"time"
)

// Handler processes one job. A nil error acks it; an error is classified
// (see backstop.Failure and backstop.ClassifyError) and decided by the policy.
type Handler func(ctx context.Context, job Job) error

// Job is a job as a worker sees it.
type Job struct {
	EntryID         string // the broker's id of this delivery (a Redis stream entry id; "" on RabbitMQ)
	ID              string // stable job id: the idempotency key
	Attempt         int64  // 1-based number of this execution
	FirstEnqueuedMs int64
	Payload         []byte
	LastError       string // the error of the previous attempt, if any
	LastReason      string
	PrevDelayMs     int64 // the delay before this attempt (decorrelated backoff)
	// DueMs is when the broker was to deliver this attempt (unix ms, the
	// broker's clock: WithEnqueueClock); 0 when unknown. The Runner
	// measures a retry's latency, failure to start, as now − (DueMs −
	// PrevDelayMs).
	DueMs int64
	// Type is the job's type ("": untyped), as the entry holds it: a type
	// written by someone else may not be valid (see ValidJobType); the job
	// runs all the same, counted under the type "other".
	Type string
	// Malformed reports an entry without a job id or a valid attempt (a
	// plain entry, none of backstop's fields, is attempt 1 of a job: see
	// queue/redisqueue/README.md); the worker dead-letters it with reason
	// "malformed".
	Malformed bool
}

// FirstEnqueued returns when the job was first enqueued.
func (j Job) FirstEnqueued() time.Time { return time.UnixMilli(j.FirstEnqueuedMs) }

// MaxJobTypeLen is the longest job type, in bytes.
const MaxJobTypeLen = 64

// ValidJobType reports why t cannot be a job type, or nil: 1..64 bytes of
// [A-Za-z0-9_./-] (no ':', which separates the fields of the counters).
func ValidJobType(t string) error {
	if t == "" || len(t) > MaxJobTypeLen {
		return fmt.Errorf("job type must be 1..%d bytes, got %d", MaxJobTypeLen, len(t))
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '/' || c == '-') {
			return fmt.Errorf("job type must be made of [A-Za-z0-9_./-], got %q", t)
		}
	}
	return nil
}
