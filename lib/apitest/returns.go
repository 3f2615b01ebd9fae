package apitest

import (
	"testing"
	"time"
)

// HangGuard is how long Returns waits before it calls a call hung.
const HangGuard = time.Minute

// Returns runs f and fails the test with why unless f returns. It is a
// hang guard, not a timing assertion: a test that uses it makes what f
// must not wait for last an hour or for ever (a timeout configured to an
// hour, a handler blocked until the test releases it after f returned),
// so f returns at once or not at all, and HangGuard only turns "not at
// all" into a failure that says why rather than the test binary's
// timeout. f runs on a goroutine of its own: it must not call t.FailNow
// (require); return what it found and check it after.
func Returns(t testing.TB, why string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(HangGuard):
		t.Fatalf("did not return within the %s hang guard: %s", HangGuard, why)
	}
}
