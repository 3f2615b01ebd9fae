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
// One new job wakes one claim (wakeOne), the one parked longest among those
// whose worker serves the job's exact name@version, so that many idle
// workers do not all query for every job (a thundering herd of claims),
// and a claim that cannot take the job does not take its wake (wake QA:
// with a worker per tool, the claim parked longest, of another tool, was
// woken, found nothing and parked again, and the job waited for its
// worker's next poll). A freed concurrency slot wakes a claim of the tool
// whose attempt freed it, at any version, else any claim, and that claim,
// finding nothing, passes it once to another tool's (wakeSlot: a report's,
// and the sweeper's, which runs in the server's process; a job it requeues
// wakes a claim of its exact version first).
// Changes that may free several jobs at once wake
// every claim parked in the workspace (wakeAll). A woken claim that stops
// without looking again (it claimed other jobs, or its wait ended) passes
// its wake on to the next claim of the same tool, so the job it was meant
// for is not left to the poll.
type waker struct {
	mu     sync.Mutex
	parked map[string][]*parkedClaim // by workspace, longest parked first
}

// parkedClaim is one parked claim: closed when a wake picks it, the
// name@version pairs its worker serves (nil: any), and the pair it was
// woken for ("" for a wake meant for any claim, or by wakeAll).
type parkedClaim struct {
	ch     chan struct{}
	tools  map[string]bool
	wokeBy string
	// slot is the tool whose freed slot woke this claim as the tool's own
	// claim (wakeSlot), "" otherwise: should its look find nothing, the
	// slot may be for another tool's job on the endpoint (passSlot).
	slot string
}

// toolKey is how the waker names an exact name@version; anyVersion names
// every version of a tool (no version is empty, so the two never meet).
func toolKey(name, version string) string { return name + "@" + version }

func anyVersion(name string) string { return name + "@" }

// serves reports whether c's worker may take a job of tool ("" for any).
func (c *parkedClaim) serves(tool string) bool { return tool == "" || c.tools == nil || c.tools[tool] }

func newWaker() *waker { return &waker{parked: map[string][]*parkedClaim{}} }

// park registers a claim about to look for work in workspace ws, for a
// worker serving tools (toolKey and anyVersion of each; nil for any). It must be called before
// the look, so that work committed after the look's snapshot still wakes
// the claim. The channel is closed when a wake picks the claim. leave must
// be called once the claim stops waiting on it; last says the claim will
// not look again, so a wake it received is passed on. leave answers the
// tool whose freed slot woke the claim (parkedClaim.slot), for the claim's
// next look to pass on (passSlot) if it finds nothing.
func (w *waker) park(ws string, tools map[string]bool) (woken <-chan struct{}, leave func(last bool) (slot string)) {
	c := &parkedClaim{ch: make(chan struct{}), tools: tools}
	w.mu.Lock()
	w.parked[ws] = append(w.parked[ws], c)
	w.mu.Unlock()
	return c.ch, func(last bool) string {
		w.mu.Lock()
		defer w.mu.Unlock()
		select {
		case <-c.ch: // woken, so already off the list
			if !last {
				return c.slot
			}
			if next := w.pickLocked(ws, func(p *parkedClaim) bool { return p.serves(c.wokeBy) }); next != nil {
				next.wokeBy, next.slot = c.wokeBy, c.slot
			}
			return ""
		default:
		}
		q := w.parked[ws]
		for i, p := range q {
			if p == c {
				q = append(q[:i:i], q[i+1:]...)
				break
			}
		}
		w.store(ws, q)
		return ""
	}
}

// wakeOne wakes the claim parked longest in workspace ws whose worker
// serves tool (toolKey; "" for any claim), if any, and reports whether
// it woke one. Call it after the commit that made one job claimable.
func (w *waker) wakeOne(ws, tool string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wakeOneLocked(ws, tool)
}

func (w *waker) wakeOneLocked(ws, tool string) bool {
	c := w.pickLocked(ws, func(c *parkedClaim) bool { return c.serves(tool) })
	if c != nil {
		c.wokeBy = tool
	}
	return c != nil
}

// pickLocked wakes the claim parked longest in workspace ws that match
// accepts, and answers it (nil: none), for the caller to say what woke it
// (under w.mu, before the claim can read it).
func (w *waker) pickLocked(ws string, match func(*parkedClaim) bool) *parkedClaim {
	q := w.parked[ws]
	for i, c := range q {
		if match(c) {
			close(c.ch)
			w.store(ws, append(q[:i:i], q[i+1:]...))
			return c
		}
	}
	return nil
}

// wakeSlot wakes a claim for a concurrency slot an attempt of tool name
// freed in workspace ws: a claim of the same tool first, at any version,
// as the endpoint's next job is most likely one (wake QA: the claim parked
// longest, of another tool on another endpoint, took the wake, found
// nothing and kept it); failing one, any claim, as the next job may be
// another tool's. The same tool's claim that then finds nothing passes the
// wake on to another tool's (passSlot): on an endpoint serving two tools,
// the slot is the other's when its tool has nothing queued (wake QA: that
// claim slept to its next poll, up to a second).
func (w *waker) wakeSlot(ws, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tool := anyVersion(name)
	if c := w.pickLocked(ws, func(c *parkedClaim) bool { return c.serves(tool) }); c != nil {
		c.wokeBy, c.slot = tool, name
		return
	}
	w.wakeOneLocked(ws, "")
}

// passSlot passes on a wake for a slot tool name freed (wakeSlot) that
// the claim woken for it found nothing to take with: to the claim parked
// longest in ws that serves no version of name. Once only: that claim,
// finding nothing either, keeps the wake, so a freed slot costs at most
// one look more than before, and the report that freed it no query.
func (w *waker) passSlot(ws, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tool := anyVersion(name)
	w.pickLocked(ws, func(c *parkedClaim) bool { return !c.serves(tool) })
}

// wakeAll wakes every claim parked in workspace ws. Call it after the
// commit that may have made several jobs claimable.
func (w *waker) wakeAll(ws string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.parked[ws] {
		close(c.ch)
	}
	delete(w.parked, ws)
}

// store keeps q as ws's parked claims; an empty list is dropped, so a
// workspace with no parked claim holds nothing.
func (w *waker) store(ws string, q []*parkedClaim) {
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
