package ratchet

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A panic in OnError is dropped on its own goroutine (the worker and its
// unsent reports survive it), and flush waits for calls in progress, but
// never longer than noticeFlush.
func TestNoticesSurvivePanicsAndFlushIsBounded(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	n := newNotices(func(err error) {
		calls.Add(1)
		panic(err)
	})
	n.notify(errors.New("first"))
	n.notify(errors.New("second"))
	n.flush()
	if calls.Load() != 2 {
		t.Fatalf("OnError called %d times before flush returned", calls.Load())
	}

	release := make(chan struct{})
	defer close(release)
	blocked := newNotices(func(error) { <-release })
	blocked.notify(errors.New("held"))
	start := time.Now()
	blocked.flush()
	if waited := time.Since(start); waited < noticeFlush/2 {
		t.Fatalf("flush returned after %v with a call in progress", waited)
	}
	newNotices(nil).flush() // nothing notified: returns at once
}
