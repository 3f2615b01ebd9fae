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

func TestWakerWakesOneClaimPerJobLongestParkedFirst(t *testing.T) {
	t.Parallel()
	w := newWaker()
	first, leaveFirst := w.park("ws_a")
	second, leaveSecond := w.park("ws_a")
	other, leaveOther := w.park("ws_b")

	w.wakeOne("ws_a")
	require.True(t, closed(first))
	require.False(t, closed(second), "one job wakes one claim")
	require.False(t, closed(other), "another workspace's claims sleep on")

	leaveFirst(false) // it looks again: the wake is used
	require.False(t, closed(second))
	w.wakeOne("ws_a")
	require.True(t, closed(second))
	leaveSecond(false)
	w.wakeOne("ws_a") // nobody parked: nothing to do

	leaveOther(true) // not woken: leaving wakes nobody
	require.Empty(t, w.parked, "a workspace with no parked claim holds nothing")
}

func TestWakerPassesOnAWakeItsClaimDidNotUse(t *testing.T) {
	t.Parallel()
	w := newWaker()
	first, leaveFirst := w.park("ws_a")
	second, leaveSecond := w.park("ws_a")
	w.wakeOne("ws_a")
	require.True(t, closed(first))

	// The woken claim ends without looking again (say its look, begun
	// before the enqueue committed, claimed other jobs): the next claim
	// gets the wake.
	leaveFirst(true)
	require.True(t, closed(second))
	leaveSecond(false)
	require.Empty(t, w.parked)
}

func TestWakerWakeAllWakesEveryClaimOfTheWorkspace(t *testing.T) {
	t.Parallel()
	w := newWaker()
	a, leaveA := w.park("ws_a")
	a2, leaveA2 := w.park("ws_a")
	b, leaveB := w.park("ws_b")
	w.wakeAll("ws_a")
	require.True(t, closed(a))
	require.True(t, closed(a2))
	require.False(t, closed(b))

	// A claim parking after the wake waits for the next one; the woken
	// claims leaving does not unregister it.
	again, leaveAgain := w.park("ws_a")
	leaveA(false)
	leaveA2(false)
	require.False(t, closed(again))
	require.Len(t, w.parked["ws_a"], 1)
	leaveAgain(false)
	leaveB(false)
	require.Empty(t, w.parked)
}
