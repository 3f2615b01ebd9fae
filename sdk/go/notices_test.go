package ratchet

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// Notices reach OnError in order; a panic in OnError is dropped (the
// worker and its unsent reports survive it); flush waits for what is
// queued, but never longer than noticeFlush.
func TestNoticesAreDeliveredInOrderAndSurvivePanics(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	n := newNotices(func(err error) {
		mu.Lock()
		got = append(got, err.Error())
		mu.Unlock()
		panic(err)
	})
	for i := range 5 {
		n.notify(fmt.Errorf("n%d", i))
	}
	n.flush()
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, ",") != "n0,n1,n2,n3,n4" {
		t.Fatalf("delivered %v", got)
	}
}

// An OnError that blocks holds up one goroutine and at most
// maxQueuedNotices notices: the rest are counted, and the count delivered
// once it returns (review: a goroutine per notice piled up, each holding
// its error).
func TestNoticesBehindABlockedOnErrorAreBoundedAndCounted(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var mu sync.Mutex
	var got []error
	n := newNotices(func(err error) {
		<-release
		mu.Lock()
		got = append(got, err)
		mu.Unlock()
	})
	const sent = maxQueuedNotices + 44
	for i := range sent {
		n.notify(fmt.Errorf("n%d", i))
	}
	start := time.Now()
	n.flush()
	if waited := time.Since(start); waited < noticeFlush/2 {
		t.Fatalf("flush returned after %v with notices undelivered", waited)
	}
	close(release)
	n.flush()
	mu.Lock()
	defer mu.Unlock()
	// The first notice may have been taken for delivery before the queue
	// filled behind it: maxQueuedNotices or one more delivered, in order,
	// then the count of the rest.
	var dropped int
	if _, err := fmt.Sscanf(got[len(got)-1].Error(), "ratchet: %d OnError notice(s) dropped", &dropped); err != nil {
		t.Fatalf("last notice %v: %v", got[len(got)-1], err)
	}
	kept := got[:len(got)-1]
	if len(kept)+dropped != sent || len(kept) < maxQueuedNotices || len(kept) > maxQueuedNotices+1 {
		t.Fatalf("delivered %d, dropped %d of %d", len(kept), dropped, sent)
	}
	for i, err := range kept {
		if err.Error() != fmt.Sprintf("n%d", i) {
			t.Fatalf("notice %d is %v", i, err)
		}
	}
	newNotices(nil).flush() // nothing notified: returns at once
}
