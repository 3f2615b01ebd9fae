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
//
// One new job wakes one claim (wakeOne), the one parked longest, so that
// many idle workers do not all query for every job (a thundering herd of
// claims); changes that may free several jobs at once wake every claim
// parked in the workspace (wakeAll). A woken claim that stops without
// looking again (it claimed other jobs, or its wait ended) passes its wake
// on to the next one, so the job it was meant for is not left to the poll.
type waker struct {
	mu     sync.Mutex
	parked map[string][]chan struct{} // by workspace, longest parked first
}

func newWaker() *waker { return &waker{parked: map[string][]chan struct{}{}} }

// park registers a claim about to look for work in workspace ws. It must be
// called before the look, so that work committed after the look's snapshot
// still wakes the claim. The channel is closed when a wake picks the claim.
// leave must be called once the claim stops waiting on it; last says the
// claim will not look again, so a wake it received is passed on.
func (w *waker) park(ws string) (woken <-chan struct{}, leave func(last bool)) {
	ch := make(chan struct{})
	w.mu.Lock()
	w.parked[ws] = append(w.parked[ws], ch)
	w.mu.Unlock()
	return ch, func(last bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		select {
		case <-ch: // woken, so already off the list
			if last {
				w.wakeOneLocked(ws)
			}
			return
		default:
		}
		q := w.parked[ws]
		for i, c := range q {
			if c == ch {
				q = append(q[:i:i], q[i+1:]...)
				break
			}
		}
		w.store(ws, q)
	}
}

// wakeOne wakes the claim parked longest in workspace ws, if any. Call it
// after the commit that made one job claimable.
func (w *waker) wakeOne(ws string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wakeOneLocked(ws)
}

func (w *waker) wakeOneLocked(ws string) {
	if q := w.parked[ws]; len(q) > 0 {
		close(q[0])
		w.store(ws, q[1:])
	}
}

// wakeAll wakes every claim parked in workspace ws. Call it after the
// commit that may have made several jobs claimable.
func (w *waker) wakeAll(ws string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.parked[ws] {
		close(ch)
	}
	delete(w.parked, ws)
}

// store keeps q as ws's parked claims; an empty list is dropped, so a
// workspace with no parked claim holds nothing.
func (w *waker) store(ws string, q []chan struct{}) {
	if len(q) == 0 {
		delete(w.parked, ws)
		return
	}
	w.parked[ws] = q
}

// maxWaitingClaimsPerKey bounds the long polls one key has waiting on one
// instance. Each looks at the queue up to once a second on the instance's
// few pooled connections, so without a bound one key's hundreds of waiting
// claims slowed every other workspace's requests (security review: 400 of
// them took another workspace's begin from 3 to 190 ms). A claim beyond it
// is answered at once, with what it finds, as a claim without waitSeconds
// is: its worker polls again at its own pace.
const maxWaitingClaimsPerKey = 32

// waitSlots counts the waiting claims per key on this instance. Only a
// resource bound: which jobs a claim gets is decided in Postgres.
type waitSlots struct {
	mu    sync.Mutex
	max   int
	byKey map[string]int
}

func newWaitSlots(max int) *waitSlots { return &waitSlots{max: max, byKey: map[string]int{}} }

// take reserves a waiting slot for key, reporting whether one was free;
// release gives it back.
func (w *waitSlots) take(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byKey[key] >= w.max {
		return false
	}
	w.byKey[key]++
	return true
}

func (w *waitSlots) release(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byKey[key]--; w.byKey[key] <= 0 {
		delete(w.byKey, key)
	}
}
