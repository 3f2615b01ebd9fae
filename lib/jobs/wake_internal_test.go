package jobs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestWakerWakesEveryClaimParkedInTheWorkspace(t *testing.T) {
	t.Parallel()
	w := newWaker()
	a, leaveA := w.park("ws_a")
	a2, leaveA2 := w.park("ws_a")
	b, leaveB := w.park("ws_b")
	require.Equal(t, 2, w.parked["ws_a"].n)

	w.wake("ws_a")
	require.True(t, closed(a))
	require.True(t, closed(a2))
	require.False(t, closed(b), "another workspace's claims sleep on")
	require.NotContains(t, w.parked, "ws_a")

	// A claim parking after the wake waits for the next one; the woken
	// claims leaving does not unregister it.
	again, leaveAgain := w.park("ws_a")
	leaveA()
	leaveA2()
	require.False(t, closed(again))
	require.Equal(t, 1, w.parked["ws_a"].n)
	w.wake("ws_a")
	require.True(t, closed(again))
	leaveAgain()

	leaveB()
	require.Empty(t, w.parked, "a workspace with no parked claim holds nothing")
	w.wake("ws_b") // nobody parked: nothing to do
	require.Empty(t, w.parked)
}
