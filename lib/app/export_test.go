package app

import "time"

// ForgetFailedStart lets a test skip the wait after a failed build.
func ForgetFailedStart() {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	defaultFailedAt = time.Time{}
}
