package ratchet

import (
	"fmt"
	"slices"
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
	const sent = maxQueuedNotices + 44
	n, release, delivered := blockedNotices(sent)
	start := time.Now()
	n.flush()
	if waited := time.Since(start); waited < noticeFlush/2 {
		t.Fatalf("flush returned after %v with notices undelivered", waited)
	}
	close(release)
	n.flush()
	got := delivered()
	// The first notice may have been taken for delivery before the queue
	// filled behind it, and a count may stand where the notices it counts
	// would have been: every notice is delivered in order or counted.
	var inOrder []int
	dropped := 0
	for _, err := range got {
		var k int
		if _, serr := fmt.Sscanf(err.Error(), "ratchet: %d OnError notice(s) dropped", &k); serr == nil {
			dropped += k
			continue
		}
		if _, serr := fmt.Sscanf(err.Error(), "n%d", &k); serr != nil || (len(inOrder) > 0 && k <= inOrder[len(inOrder)-1]) {
			t.Fatalf("notice %v out of order after %v", err, inOrder)
		}
		inOrder = append(inOrder, k)
	}
	if len(inOrder)+dropped != sent || dropped == 0 || len(inOrder) > maxQueuedNotices+1 || inOrder[0] != 0 {
		t.Fatalf("delivered %d, dropped %d of %d", len(inOrder), dropped, sent)
	}
	newNotices(nil, nil, time.Now).flush() // nothing notified: returns at once
}

// The refusal that stopped the worker reaches OnError even behind
// maxQueuedNotices notices for a blocked OnError, after the count of those
// dropped before it (review: it was only counted).
func TestNoticesNeverDropTheRefusal(t *testing.T) {
	t.Parallel()
	n, release, delivered := blockedNotices(maxQueuedNotices + 10)
	refusal := fmt.Errorf("refused")
	n.refused(refusal)
	close(release)
	n.flush()
	got := delivered()
	if len(got) < 2 || got[len(got)-1] != refusal || !strings.Contains(got[len(got)-2].Error(), "dropped") {
		t.Fatalf("the last notices delivered were %v, want the count dropped, then the refusal", got[max(len(got)-2, 0):])
	}
}

// blockedNotices is notices whose OnError blocks until release is closed,
// sent notices "n0", "n1"... already; delivered lists what OnError was
// given so far.
func blockedNotices(sent int) (n *notices, release chan struct{}, delivered func() []error) {
	release = make(chan struct{})
	var mu sync.Mutex
	var got []error
	n = newNotices(func(err error) {
		<-release
		mu.Lock()
		got = append(got, err)
		mu.Unlock()
	}, nil, time.Now)
	for i := range sent {
		n.notify(fmt.Errorf("n%d", i))
	}
	return n, release, func() []error {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}
