package apitest

import (
	"fmt"
	"os"
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
// timeout. f runs on a goroutine of its own: a require in it that fails
// ends that goroutine, and Returns then ends the test.
func Returns(t testing.TB, why string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		if t.Failed() {
			t.FailNow()
		}
	case <-time.After(HangGuard):
		// Said at once as well: the test's cleanup may then wait for
		// the hung call (an httptest server does), until go test's
		// -timeout ends the binary, and a failed test's log is only
		// printed when it ends.
		msg := fmt.Sprintf("did not return within the %s hang guard: %s", HangGuard, why)
		fmt.Fprintf(os.Stderr, "--- %s: %s\n", t.Name(), msg)
		t.Fatal(msg)
	}
}
