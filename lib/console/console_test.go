package console_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/console"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/jobs"
)

// The webhooks page offers every event type a subscription may name, and
// no other (a type added to the service and not to the page could not be
// subscribed to from the console).
func TestConsoleOffersEveryWebhookEvent(t *testing.T) {
	var js string
	for _, f := range console.Files() {
		if f.Name == "console.js" {
			js = string(f.Body)
		}
	}
	m := regexp.MustCompile(`const events = \[([^\]]*)\];`).FindStringSubmatch(js)
	require.NotNil(t, m, "the webhooks page's event list")
	var offered []string
	for _, q := range strings.Split(m[1], ",") {
		offered = append(offered, strings.Trim(strings.TrimSpace(q), "'"))
	}
	require.Equal(t, events.Types, offered)
}

// The endpoint page shows a built-in retry preset's schedule, which the
// policy routes leave out, from its own copy of the presets: a switch to
// CUSTOM starts from it, so it must be the service's.
func TestConsoleRetryPresetsAreTheService(t *testing.T) {
	var js string
	for _, f := range console.Files() {
		if f.Name == "console.js" {
			js = string(f.Body)
		}
	}
	m := regexp.MustCompile(`(?s)const retryPresets = \{\n(.*?)\n\};`).FindStringSubmatch(js)
	require.NotNil(t, m, "the endpoint page's retry presets")
	line := regexp.MustCompile(`^\t(\w+): \{ maxAttempts: (\d+), initialDelayMs: (\d+), multiplier: ([\d.]+), maxDelayMs: (\d+), jitterPercent: ([\d.]+) \},$`)
	got := map[string]jobs.RetryPolicy{}
	for _, l := range strings.Split(m[1], "\n") {
		f := line.FindStringSubmatch(l)
		require.NotNil(t, f, "a preset line the test cannot read: %q", l)
		num := func(s string) float64 {
			v, err := strconv.ParseFloat(s, 64)
			require.NoError(t, err)
			return v
		}
		got[f[1]] = jobs.RetryPolicy{Preset: f[1], MaxAttempts: int(num(f[2])), InitialDelayMs: int64(num(f[3])),
			Multiplier: num(f[4]), MaxDelayMs: int64(num(f[5])), JitterPercent: num(f[6])}
	}
	require.Equal(t, jobs.Presets, got)
}
