package jobs

import "sync"

// waker lets a long-polling claim sleep until its next poll or until this
// process makes work claimable in its workspace, whichever comes first.
//
// It is a hint and nothing more: a claim still finds its jobs in Postgres,
// and work queued by another instance (every serverless request may be one)
// is found at the claimer's next poll, as before. What it saves is the poll
// pause on a long-running server (functions/local, a container) where the
// producer and the waiting worker reach the same process: the job is
// claimed as soon as its enqueue commits.
type waker struct {
	mu     sync.Mutex
	parked map[string]*parking // by workspace
}

// parking is one workspace's waiting claims; ch is closed to wake them all.
type parking struct {
	ch chan struct{}
	n  int
}

func newWaker() *waker { return &waker{parked: map[string]*parking{}} }

// park registers a claim about to look for work in workspace ws. It must be
// called before the look, so that work committed after the look's snapshot
// still wakes the claim. The channel is closed by the next wake of ws;
// leave must be called once the claim stops waiting on it.
func (w *waker) park(ws string) (woken <-chan struct{}, leave func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.parked[ws]
	if p == nil {
		p = &parking{ch: make(chan struct{})}
		w.parked[ws] = p
	}
	p.n++
	return p.ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		p.n--
		// After a wake, p is no longer the workspace's parking.
		if p.n == 0 && w.parked[ws] == p {
			delete(w.parked, ws)
		}
	}
}

// wake wakes every claim parked in workspace ws. Call it after the commit
// that made work claimable.
func (w *waker) wake(ws string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.parked[ws]; p != nil {
		close(p.ch)
		delete(w.parked, ws)
	}
}
