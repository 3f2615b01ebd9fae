package app

import "time"

// ForgetFailedStart lets a test skip the wait after a failed build.
func ForgetFailedStart() {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	defaultFailedAt = time.Time{}
}

// SetLapsedLeasesPerPass sets the batch of effects.lapsed_leases until the
// test ends.
func SetLapsedLeasesPerPass(t interface{ Cleanup(func()) }, n int) {
	old := lapsedLeasesPerPass
	lapsedLeasesPerPass = n
	t.Cleanup(func() { lapsedLeasesPerPass = old })
}
