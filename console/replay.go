package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/backstop-dev/backstop/queue"
)

// A replay from the console runs in the background, paced as the CLI's
// (queue.Pacer), each batch one Replay, until the limit or a batch that
// moves fewer than it asked; the dead letters selected on a page are
// replayed one Replay by job id each, at the same pace. Its page shows the
// progress. A filtered batch scans the DLQ from its start again (Replay
// keeps no cursor): bounded by the broker's own scan per call.

// maxReplay bounds one console replay; keepReplays is how many replays'
// progress pages are kept.
const (
	maxReplay   = 100_000
	keepReplays = 100
	// maxSelected bounds the dead letters selected for one replay (a few
	// pages' worth).
	maxSelected = 500
	// maxRunningReplays bounds the replays running at once (each a
	// goroutine of up to an hour): one more is refused with 429.
	maxRunningReplays = 4
)

type replayJob struct {
	ID     int
	Queue  string
	Actor  string
	Filter filter
	IDs    []string // the selected dead letters' job ids, when selected
	Limit  int
	Rate   float64
	Moved  int
	Done   bool
	Err    string
	Start  time.Time
}

func (s *Server) replay(w http.ResponseWriter, r *http.Request, q queue.Queue) {
	f := filterOf(r)
	ids := r.PostForm["ids"]
	limit := atoiOr(r.PostForm.Get("limit"), 0)
	if len(ids) > 0 {
		if len(ids) > maxSelected {
			s.fail(w, r, http.StatusBadRequest, fmt.Errorf("at most %d dead letters can be selected at once, got %d", maxSelected, len(ids)))
			return
		}
		for _, id := range ids {
			if id == "" {
				s.fail(w, r, http.StatusBadRequest, fmt.Errorf("a selected dead letter has no job id"))
				return
			}
		}
		f, limit = filter{}, len(ids)
	}
	if limit < 1 || limit > maxReplay {
		s.fail(w, r, http.StatusBadRequest, fmt.Errorf("limit must be in 1..%d, got %q", maxReplay, r.PostForm.Get("limit")))
		return
	}
	rate := 0.0
	if v := r.PostForm.Get("rate"); v != "" {
		var err error
		if rate, err = queue.ParseRate(v); err != nil {
			s.fail(w, r, http.StatusBadRequest, err)
			return
		}
	}
	if f.Type != "" {
		if err := queue.ValidJobType(f.Type); err != nil {
			s.fail(w, r, http.StatusBadRequest, err)
			return
		}
	}
	s.mu.Lock()
	if s.running >= maxRunningReplays {
		s.mu.Unlock()
		s.fail(w, r, http.StatusTooManyRequests, fmt.Errorf("%d replays are running: wait for one to finish", maxRunningReplays))
		return
	}
	s.running++
	s.replayID++
	j := &replayJob{ID: s.replayID, Queue: q.Name(), Actor: actor(r), Filter: f, IDs: ids, Limit: limit, Rate: rate, Start: time.Now()}
	s.replays[j.ID] = j
	delete(s.replays, j.ID-keepReplays) // the progress of the last keepReplays only
	s.mu.Unlock()
	s.cfg.log.Info("console replay", "queue", q.Name(), "actor", j.Actor, "limit", limit, "rate", rate,
		"reason", f.Reason, "type", f.Type, "id", f.ID, "selected", len(ids))
	go s.runReplay(q, j)
	http.Redirect(w, r, "/replays/"+strconv.Itoa(j.ID), http.StatusSeeOther)
}

func (s *Server) runReplay(q queue.Queue, j *replayJob) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	// The CLI's pacing (dlq replay --rate): batches of ceil(rate/10), one
	// every batch/rate seconds; unpaced, one call of the whole limit.
	batch := j.Limit
	if len(j.IDs) > 0 {
		batch = 1 // one Replay by job id each
	}
	pace := queue.NewPacer(j.Rate, batch)
	defer pace.Stop()
	moved, err := 0, error(nil)
	for _, id := range j.IDs {
		if err = pace.Wait(ctx); err != nil {
			break
		}
		var n int
		// A selected one already gone (replayed or discarded meanwhile)
		// moves nothing: the others still go.
		n, err = q.Replay(ctx, queue.ReplayOptions{Limit: 1, ID: id, Actor: j.Actor})
		moved += n
		s.mu.Lock()
		j.Moved = moved
		s.mu.Unlock()
		if err != nil {
			break
		}
	}
	for len(j.IDs) == 0 && moved < j.Limit {
		if err = pace.Wait(ctx); err != nil {
			break
		}
		want := min(pace.Batch(), j.Limit-moved)
		var n int
		n, err = q.Replay(ctx, queue.ReplayOptions{Limit: want, Reason: j.Filter.Reason, JobType: j.Filter.Type, ID: j.Filter.ID,
			Actor: j.Actor}) // each one recorded in the audit
		moved += n
		s.mu.Lock()
		j.Moved = moved
		s.mu.Unlock()
		if err != nil || n < want {
			break
		}
	}
	s.mu.Lock()
	s.running--
	j.Done = true
	if err != nil {
		j.Err = err.Error()
	}
	s.mu.Unlock()
	s.cfg.log.Info("console replay done", "queue", q.Name(), "actor", j.Actor, "replayed", moved, "err", err)
}

func (s *Server) replayProgress(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.Atoi(r.PathValue("id"))
	s.mu.Lock()
	j, ok := s.replays[id]
	var snap replayJob
	if ok {
		snap = *j
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "no such replay", http.StatusNotFound)
		return
	}
	pct := 100
	if !snap.Done {
		pct = snap.Moved * 100 / snap.Limit
	}
	s.render(w, r, "replay.html", http.StatusOK, page{Title: "Replay", Queue: snap.Queue, Refresh: !snap.Done, Data: map[string]any{
		"Job": snap, "Percent": pct, "Back": "/queues/" + url.PathEscape(snap.Queue) + "/dlq"}})
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
