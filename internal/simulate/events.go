package simulate

import (
	"errors"
	"math"
)

// event is something that happens to one client at a virtual instant.
type event struct {
	at   int64  // virtual time, in the simulation's unit
	seq  uint64 // scheduling order: breaks ties, so runs replay exactly
	id   int32  // client
	kind uint8  // what happens (the simulation's own meaning)
}

// queue is a binary min-heap of events by (at, seq). It is written out
// rather than built on container/heap, whose interface boxing allocates on
// every push.
type queue struct {
	ev  []event
	seq uint64
}

// maxClock is the latest virtual instant a retry may be scheduled at:
// half of what int64 holds, so the network delays added after it cannot
// overflow either. Policies whose delays run for centuries reach it (a
// Duration's 292 years a retry, in microseconds), and a time that wrapped
// negative would reorder the whole run.
const maxClock = math.MaxInt64 / 2

// after returns the instant d after at, and false when it is past maxClock.
func after(at, d int64) (int64, bool) {
	if d < 0 || at > maxClock-d {
		return 0, false
	}
	return at + d, true
}

// errClock is the error of a run whose virtual time would overflow.
var errClock = errors.New("simulate: stopped: the virtual clock would overflow (the policy's delays are too long to simulate)")

func (q *queue) push(at int64, id int32, kind uint8) {
	q.seq++
	q.ev = append(q.ev, event{at: at, seq: q.seq, id: id, kind: kind})
	i := len(q.ev) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			break
		}
		q.ev[i], q.ev[parent] = q.ev[parent], q.ev[i]
		i = parent
	}
}

func (q *queue) pop() event {
	top := q.ev[0]
	last := len(q.ev) - 1
	q.ev[0] = q.ev[last]
	q.ev = q.ev[:last]
	for i := 0; ; {
		small, l, r := i, 2*i+1, 2*i+2
		if l < last && q.less(l, small) {
			small = l
		}
		if r < last && q.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		q.ev[i], q.ev[small] = q.ev[small], q.ev[i]
		i = small
	}
	return top
}

func (q *queue) less(i, j int) bool {
	a, b := &q.ev[i], &q.ev[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (q *queue) empty() bool { return len(q.ev) == 0 }

func (q *queue) reset() {
	q.ev = q.ev[:0]
	q.seq = 0
}
