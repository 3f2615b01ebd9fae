package app

import "time"

// ForgetFailedStart lets a test skip the wait after a failed build.
func ForgetFailedStart() {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	defaultFailedAt = time.Time{}
}

// ForgetDefault makes the next Default build afresh, as in a new instance,
// and closes the App an earlier one built (a test run with -count=N would
// otherwise find the last run's App and no failure).
func ForgetDefault() {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	if defaultApp != nil {
		defaultApp.Close()
	}
	defaultApp, defaultErr, defaultFailedAt = nil, nil, time.Time{}
}

// SetLapsedLeasesPerPass sets the batch of effects.lapsed_leases until the
// test ends.
func SetLapsedLeasesPerPass(t interface{ Cleanup(func()) }, n int) {
	old := lapsedLeasesPerPass
	lapsedLeasesPerPass = n
	t.Cleanup(func() { lapsedLeasesPerPass = old })
}
