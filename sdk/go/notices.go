package ratchet

import (
	"sync"
	"time"
)

// noticeFlush bounds how long Stop waits for OnError calls still running
// when it is done: long enough for a logger, short enough that a Stop called
// from OnError itself (which waits for its own call) returns promptly.
const noticeFlush = time.Second

// notices delivers a worker's OnError calls, each on a goroutine of its own,
// so that neither the poll loop, nor a heartbeat, nor the reporter waits for
// the caller's callback (QA: a Stop called from OnError waited for the poll
// loop, which was waiting for that OnError call to return, and never
// returned; a slow logger held up every report). A panic in OnError is
// recovered and dropped: it must not take the worker down with every
// unsent report, and there is nowhere left to report it.
type notices struct {
	onError func(error)

	mu      sync.Mutex
	pending int           // calls not yet returned
	idle    chan struct{} // closed when pending drops to zero; nil while it is zero
}

func newNotices(onError func(error)) *notices {
	if onError == nil {
		onError = func(error) {}
	}
	return &notices{onError: onError}
}

// notify calls OnError with err on a goroutine of its own.
func (n *notices) notify(err error) {
	n.mu.Lock()
	n.pending++
	if n.idle == nil {
		n.idle = make(chan struct{})
	}
	n.mu.Unlock()
	go func() {
		defer n.done()
		defer func() { _ = recover() }()
		n.onError(err)
	}()
}

func (n *notices) done() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pending--
	if n.pending == 0 {
		close(n.idle)
		n.idle = nil
	}
}

// flush waits for the OnError calls in progress to return, for at most
// noticeFlush, so that what Stop's error refers to ("see OnError") has been
// delivered when it returns, even when its deadline has passed.
func (n *notices) flush() {
	n.mu.Lock()
	idle := n.idle
	n.mu.Unlock()
	if idle == nil {
		return
	}
	t := time.NewTimer(noticeFlush)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}
