package ratchet

import (
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// noticeFlush bounds how long Stop waits for OnError notices still queued
// or being delivered when it is done: long enough for a logger, short enough
// that a Stop called from OnError itself (which waits for its own call)
// returns promptly.
const noticeFlush = time.Second

// maxQueuedNotices bounds the notices waiting for a slow OnError; beyond it
// they are dropped and counted, and the count is delivered once the queue
// has drained.
const maxQueuedNotices = 256

// notices delivers a worker's OnError calls in order on a goroutine of its
// own, started when a notice arrives and ended when none is left, so that
// neither the poll loop, nor a heartbeat, nor the reporter waits for the
// caller's callback (QA: a Stop called from OnError waited for the poll
// loop, which was waiting for that OnError call to return, and never
// returned; a slow logger held up every report). A panic in OnError is
// recovered and dropped: it must not take the worker down with every unsent
// report, and there is nowhere left to report it.
type notices struct {
	onError func(error)

	mu         sync.Mutex
	log        *failureLog // without OnError: the default failure log (its state under mu)
	queue      []error
	dropped    int           // notices refused since the last delivered count
	delivering bool          // the delivery goroutine runs
	idle       chan struct{} // closed when delivery ends with nothing left; nil while idle
}

// newNotices delivers to onError; when it is nil, to the default failure log
// (log/slog's default logger, or logger when not nil), paced by now.
func newNotices(onError func(error), logger *slog.Logger, now func() time.Time) *notices {
	if onError != nil {
		return &notices{onError: onError}
	}
	return &notices{log: &failureLog{logger: logger, now: now}, onError: func(err error) {
		if line, ok := err.(*logLine); ok {
			line.write()
		}
	}}
}

// notify queues err for OnError, or counts it when the queue is full. The
// count of notices dropped goes in the queue ahead of the next one taken,
// where they would have been (or is delivered once the queue drains).
// Without OnError, what is queued is err's line in the default failure log,
// if it has one.
func (n *notices) notify(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.log != nil {
		if line := n.log.failure(err); line != nil {
			n.enqueue(line)
		}
		return
	}
	n.enqueue(err)
}

// refused queues err, a refusal that stopped the worker, for OnError; without
// OnError, its line in the default failure log, written whatever the pacing.
// It is queued past maxQueuedNotices: the one notice that says why the
// worker stopped is never dropped (review: behind 256 notices for a slow
// OnError it was only counted).
func (n *notices) refused(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.log != nil {
		n.push(n.log.refusal(err), false)
		return
	}
	n.push(err, false)
}

// stopped tells the default failure log that the worker stopped: it writes
// the count of the problems left out since its last line, if any (nothing
// with OnError).
func (n *notices) stopped() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.log == nil {
		return
	}
	if line := n.log.stopped(); line != nil {
		n.enqueue(line)
	}
}

// recovered tells the default failure log that a registration or claim
// succeeded (nothing with OnError).
func (n *notices) recovered() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.log == nil {
		return
	}
	if line := n.log.recovered(); line != nil {
		n.enqueue(line)
	}
}

// enqueue queues err for delivery, or counts it when maxQueuedNotices are
// queued (under mu).
func (n *notices) enqueue(err error) { n.push(err, true) }

// push queues err for delivery, after the count of those dropped before it;
// when bounded, it counts err instead once maxQueuedNotices are queued (under
// mu).
func (n *notices) push(err error, bounded bool) {
	if n.dropped > 0 && (len(n.queue) < maxQueuedNotices || !bounded) {
		n.queue = append(n.queue, n.droppedNotice())
	}
	if bounded && len(n.queue) >= maxQueuedNotices {
		n.dropped++
		return
	}
	n.queue = append(n.queue, err)
	if !n.delivering {
		n.delivering, n.idle = true, make(chan struct{})
		go n.deliver()
	}
}

// deliver calls OnError for each queued notice, then for the count of those
// dropped, until none is left.
func (n *notices) deliver() {
	for {
		n.mu.Lock()
		var next error
		switch {
		case len(n.queue) > 0:
			next, n.queue[0] = n.queue[0], nil
			n.queue = n.queue[1:]
		case n.dropped > 0:
			next = n.droppedNotice()
		default:
			n.delivering = false
			close(n.idle)
			n.idle = nil
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()
		n.call(next)
	}
}

// droppedNotice is the notice of those dropped since the last one, and
// resets their count (under mu).
func (n *notices) droppedNotice() error {
	err := fmt.Errorf("ratchet: %d OnError notice(s) dropped: %d were queued while OnError was still busy",
		n.dropped, maxQueuedNotices)
	n.dropped = 0
	return err
}

func (n *notices) call(err error) {
	defer func() { _ = recover() }()
	n.onError(err)
}

// flush waits for the notices queued so far to be delivered, for at most
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
