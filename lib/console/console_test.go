package console_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/console"
	"github.com/getratchet/ratchet/lib/events"
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
