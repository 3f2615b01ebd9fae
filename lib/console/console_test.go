package console_test

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/console"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jobs"
)

// consoleJS is the console's script.
func consoleJS(t *testing.T) string {
	t.Helper()
	for _, f := range console.Files() {
		if f.Name == "console.js" {
			return string(f.Body)
		}
	}
	t.Fatal("no console.js")
	return ""
}

// Every text field a console form sends is held to its route's limit, as
// the OpenAPI document states it: the notes were held to 1 000 characters
// where the routes take 2 000, so an operator's longer note was cut off by
// the page, not the API. Literal limits are left only on the two fields
// that name a path segment (an effect type and a tool name), which no
// request body states.
func TestConsoleFieldLimitsAreTheAPIs(t *testing.T) {
	js := consoleJS(t)
	m := regexp.MustCompile(`(?s)const maxLengths = \{\n(.*?)\n\};`).FindStringSubmatch(js)
	require.NotNil(t, m, "the console's maxLengths table")
	raw, err := json.Marshal(httpapi.OpenAPI())
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]struct {
			RequestBody struct {
				Content map[string]struct {
					Schema struct {
						Properties map[string]json.RawMessage `json:"properties"`
					} `json:"schema"`
				} `json:"content"`
			} `json:"requestBody"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	line := regexp.MustCompile(`^\t'([A-Z]+) (\S+) (\w+)': (\d+),$`)
	entries := strings.Split(m[1], "\n")
	require.NotEmpty(t, entries)
	for _, l := range entries {
		f := line.FindStringSubmatch(l)
		require.NotNil(t, f, "a maxLengths line the test cannot read: %q", l)
		op, ok := doc.Paths["/api/v1"+f[2]][strings.ToLower(f[1])]
		require.True(t, ok, "no route %s %s", f[1], f[2])
		schema, ok := op.RequestBody.Content["application/json"].Schema.Properties[f[3]]
		require.True(t, ok, "%s %s takes no field %s", f[1], f[2], f[3])
		var prop struct {
			MaxLength *int `json:"maxLength"`
		}
		require.NoError(t, json.Unmarshal(schema, &prop), "%s %s %s", f[1], f[2], f[3])
		require.NotNil(t, prop.MaxLength, "%s %s states no maxLength for %s", f[1], f[2], f[3])
		require.Equal(t, strconv.Itoa(*prop.MaxLength), f[4], "%s %s %s", f[1], f[2], f[3])
		require.Contains(t, js, "maxlength: maxLengths['"+f[1]+" "+f[2]+" "+f[3]+"']", "no form uses the limit of %s %s %s", f[1], f[2], f[3])
	}
	require.Len(t, regexp.MustCompile(`maxlength: \d`).FindAllString(js, -1), 2,
		"a form field held to a literal limit: state it in maxLengths")
}

// The webhooks page offers every event type a subscription may name, and
// no other (a type added to the service and not to the page could not be
// subscribed to from the console).
func TestConsoleOffersEveryWebhookEvent(t *testing.T) {
	js := consoleJS(t)
	m := regexp.MustCompile(`const webhookEvents = \[([^\]]*)\];`).FindStringSubmatch(js)
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
	js := consoleJS(t)
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

// Every console request to a route that takes an Idempotency-Key goes
// through idempotent(), which sends one per form fill: without it, a form
// sent again after its answer was lost made a second key, subscription or
// job, the first one's secret never seen (review). A call() naming such a
// route (a create added later, say) fails here; the page tests
// (lib/console/jstest) check what the key does.
func TestConsoleSendsAnIdempotencyKeyWhereTaken(t *testing.T) {
	js := consoleJS(t)
	param := regexp.MustCompile(`\\\{[^}]*\\\}`)
	var keyed int
	for _, r := range httpapi.Routes() {
		if !r.Idempotent {
			continue
		}
		keyed++
		path := param.ReplaceAllString(regexp.QuoteMeta(strings.TrimPrefix(r.Pattern, "/api/v1")), `\$\{[^}]*\}`)
		bare := regexp.MustCompile(`call\('` + r.Method + `', [` + "`'" + `]` + path + `[` + "`'" + `?]`)
		require.Nil(t, bare.FindStringIndex(js), "the console calls %s %s without its Idempotency-Key: send it through idempotent()", r.Method, r.Pattern)
	}
	require.GreaterOrEqual(t, keyed, 9, "the routes taking an Idempotency-Key")
}
