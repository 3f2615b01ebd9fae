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
	}, nil, time.Now)
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
	}, nil, time.Now)
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
	// filled behind it, and a count may stand where the notices it counts
	// would have been: every notice is delivered in order or counted.
	var delivered []int
	dropped := 0
	for _, err := range got {
		var k int
		if _, serr := fmt.Sscanf(err.Error(), "ratchet: %d OnError notice(s) dropped", &k); serr == nil {
			dropped += k
			continue
		}
		if _, serr := fmt.Sscanf(err.Error(), "n%d", &k); serr != nil || (len(delivered) > 0 && k <= delivered[len(delivered)-1]) {
			t.Fatalf("notice %v out of order after %v", err, delivered)
		}
		delivered = append(delivered, k)
	}
	if len(delivered)+dropped != sent || dropped == 0 || len(delivered) > maxQueuedNotices+1 || delivered[0] != 0 {
		t.Fatalf("delivered %d, dropped %d of %d", len(delivered), dropped, sent)
	}
	newNotices(nil, nil, time.Now).flush() // nothing notified: returns at once
}
