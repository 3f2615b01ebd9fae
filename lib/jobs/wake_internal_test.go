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
	first, leaveFirst := w.park("ws_a", nil)
	second, leaveSecond := w.park("ws_a", nil)
	other, leaveOther := w.park("ws_b", nil)

	w.wakeOne("ws_a", "")
	require.True(t, closed(first))
	require.False(t, closed(second), "one job wakes one claim")
	require.False(t, closed(other), "another workspace's claims sleep on")

	leaveFirst(false) // it looks again: the wake is used
	require.False(t, closed(second))
	w.wakeOne("ws_a", "")
	require.True(t, closed(second))
	leaveSecond(false)
	w.wakeOne("ws_a", "") // nobody parked: nothing to do

	leaveOther(true) // not woken: leaving wakes nobody
	require.Empty(t, w.parked, "a workspace with no parked claim holds nothing")
}

func TestWakerPassesOnAWakeItsClaimDidNotUse(t *testing.T) {
	t.Parallel()
	w := newWaker()
	first, leaveFirst := w.park("ws_a", nil)
	second, leaveSecond := w.park("ws_a", nil)
	w.wakeOne("ws_a", "")
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
	a, leaveA := w.park("ws_a", nil)
	a2, leaveA2 := w.park("ws_a", nil)
	b, leaveB := w.park("ws_b", nil)
	w.wakeAll("ws_a")
	require.True(t, closed(a))
	require.True(t, closed(a2))
	require.False(t, closed(b))

	// A claim parking after the wake waits for the next one; the woken
	// claims leaving does not unregister it.
	again, leaveAgain := w.park("ws_a", nil)
	leaveA(false)
	leaveA2(false)
	require.False(t, closed(again))
	require.Len(t, w.parked["ws_a"], 1)
	leaveAgain(false)
	leaveB(false)
	require.Empty(t, w.parked)
}

func TestWakerWakesAClaimOfTheJobsToolAndPassesTheWakeOnToAnother(t *testing.T) {
	t.Parallel()
	w := newWaker()
	sms, leaveSMS := w.park("ws_a", map[string]bool{toolKey("send_sms", "1"): true})
	email, leaveEmail := w.park("ws_a", map[string]bool{toolKey("send_email", "1"): true})
	email2, leaveEmail2 := w.park("ws_a", map[string]bool{toolKey("send_email", "1"): true})

	require.True(t, w.wakeOne("ws_a", toolKey("send_email", "1")))
	require.False(t, closed(sms), "a claim of another tool cannot take the job")
	require.True(t, closed(email))
	require.False(t, closed(email2))

	// The woken claim ends without looking again: its wake goes to the
	// next claim of the same tool, not to the one parked longest.
	leaveEmail(true)
	require.False(t, closed(sms))
	require.True(t, closed(email2))
	leaveEmail2(false)

	require.False(t, w.wakeOne("ws_a", toolKey("send_email", "2")), "no claim serves that version")
	require.True(t, w.wakeOne("ws_a", ""), "a freed slot wakes any claim")
	require.True(t, closed(sms))
	leaveSMS(false)
	require.Empty(t, w.parked)
}
