package exporter

import "time"

// The oldest job's age on RabbitMQ (backstop_oldest_job_age_seconds), read
// without touching a message: a quorum queue reports no head timestamp
// (head_message_timestamp is classic queues' only), and peeking at the head
// with basic.get and a requeue counts a delivery, which the workers read as
// a crash loop (dead-lettered at 5) and the broker at its x-delivery-limit.
// Instead the exporter keeps, per work queue, when the queue's cumulative
// arrivals reached each count it saw (an arrival curve), and the queue being
// first in, first out, the oldest message in it is arrival number
// in − messages + 1: it had arrived by the first scrape whose count reached
// that number.

// maxArrivalSamples bounds the samples kept per queue: past it every
// second one but the first and the last goes, which only makes the bound
// looser (a later sample), never wrong.
const maxArrivalSamples = 512

// arrivalSample is a scrape's cumulative arrival count and its time.
type arrivalSample struct {
	at time.Time
	in int64
}

// arrivals is one work queue's arrival curve: the samples in increasing
// order of count, from the first scrape that saw the oldest message still
// in the queue (or the exporter's start).
type arrivals struct{ s []arrivalSample }

// observe records a scrape at now that saw in messages arrive in all and
// messages still in the queue (ready or unacked), and returns a lower
// bound of the oldest one's age: it had arrived by the first sample whose
// count reaches its number. Exact to the scrape interval for a queue
// worked in order; a message returned to the queue (older than the
// others) or one a worker holds while the ones after it finish make it a
// lower bound, as the Redis reading's is. Counts that go back (the broker
// restarted: its statistics start from 0) start the curve again.
func (a *arrivals) observe(now time.Time, in, messages int64) time.Duration {
	if n := len(a.s); n == 0 || in < a.s[n-1].in {
		a.s = append(a.s[:0], arrivalSample{now, in})
	} else if in > a.s[n-1].in {
		a.s = append(a.s, arrivalSample{now, in})
	}
	if messages <= 0 {
		a.s = append(a.s[:0], a.s[len(a.s)-1]) // all gone: the next ones arrive after it
		return 0
	}
	oldest := in - messages + 1
	i := 0
	for i < len(a.s)-1 && a.s[i].in < oldest {
		i++
	}
	a.s = a.s[i:] // arrived and gone
	if len(a.s) > maxArrivalSamples {
		kept := a.s[:1]
		for j := 1; j < len(a.s)-1; j += 2 {
			kept = append(kept, a.s[j])
		}
		a.s = append(kept, a.s[len(a.s)-1])
	}
	return max(now.Sub(a.s[0].at), 0)
}
