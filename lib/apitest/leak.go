package apitest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Mark is what every user-controlled value of a log-leak test carries
// (lib/sdktest's TestNothingUserControlledIsLogged and its siblings, the
// functions' own): no log line may hold it, in any case.
const Mark = "zqleak"

// Marked is a fresh marked value: Mark, label and n.
func Marked(label string, n int) string { return fmt.Sprintf("%s_%s_%d", Mark, label, n) }

// RequireNoLeak fails when logs hold Mark (in any case) or any of secrets,
// whole or either half (a lease token's id or its secret part alone), and
// when logs lack one of the lines required (else the test holds nothing:
// the path it meant to log never ran).
func RequireNoLeak(t testing.TB, logs string, secrets []string, required ...string) {
	t.Helper()
	require.NotEmpty(t, logs, "something is logged (else the test holds nothing)")
	if i := strings.Index(strings.ToLower(logs), Mark); i >= 0 {
		start := strings.LastIndexByte(logs[:i], '\n') + 1
		end := strings.IndexByte(logs[i:], '\n')
		if end < 0 {
			end = len(logs) - i
		}
		t.Fatalf("a log line holds a marked value:\n%s", logs[start:i+end])
	}
	for _, secret := range secrets {
		require.NotContains(t, logs, secret)
		half := len(secret) / 2
		require.NotContains(t, logs, secret[:half], "the first half of a secret")
		require.NotContains(t, logs, secret[half:], "the second half of a secret")
	}
	for _, line := range required {
		require.Contains(t, logs, line, "a line the test needs was not logged")
	}
}
