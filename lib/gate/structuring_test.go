package gate_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func (b *bundle) structuring(effectType string) map[string]any {
	b.t.Helper()
	return b.env.Must(http.StatusOK, "GET", "/api/v1/policies/"+effectType+"/structuring", b.ws.Key, nil).JSON()
}

func windows(t *testing.T, s map[string]any) (day, week map[string]any) {
	t.Helper()
	ws := s["windows"].([]any)
	require.Len(t, ws, 2)
	day, week = ws[0].(map[string]any), ws[1].(map[string]any)
	require.EqualValues(t, 24, day["hours"])
	require.EqualValues(t, 168, week["hours"])
	return day, week
}

func requireBands(t *testing.T, w map[string]any, declared, below80, from80, from90, above int) {
	t.Helper()
	require.EqualValues(t, declared, w["declared"], "declared")
	require.EqualValues(t, below80, w["below_80_percent"], "below 80 %%")
	require.EqualValues(t, from80, w["from_80_to_90_percent"], "80-90 %%")
	require.EqualValues(t, from90, w["from_90_to_100_percent"], "90-100 %%")
	require.EqualValues(t, above, w["at_or_above"], "at or above")
}

// TestStructuringMeasuresCrowdingBelowTheLine: declared costs are counted by
// band of the watch line, over 24 hours and 7 days, denied begins included
// (a declaration is what is measured), undeclared costs not at all; the line
// is never enforced.
func TestStructuringMeasuresCrowdingBelowTheLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"structuring_threshold_micros": 10_000})

	// Eight days ago: outside both windows. Two days ago: the week only.
	b.mustBegin("execute", charge(key("old"), 9_900))
	b.clock.Add(6 * 24 * time.Hour)
	b.mustBegin("execute", charge(key("week"), 9_500))
	b.clock.Add(2 * 24 * time.Hour)
	for _, c := range []int{1_000, 7_999, 8_000, 8_999, 9_000, 9_999, 9_999, 10_000, 25_000} {
		b.mustBegin("execute", charge(key("day"), c)) // above the line too: it only watches
	}
	b.mustBegin("execute", charge(key("free"), nil))

	s := b.structuring("api.call")
	require.EqualValues(t, 10_000, s["threshold_micros"])
	require.Equal(t, "structuring_threshold_micros", s["threshold_from"])
	require.Equal(t, b.clock.Now().UTC().Format(time.RFC3339), s["as_of"])
	day, week := windows(t, s)
	requireBands(t, day, 9, 2, 2, 3, 2)
	require.InDelta(t, 3.0/9, day["share_just_below"], 1e-9)
	requireBands(t, week, 10, 2, 2, 4, 2)

	// Null falls back to max_cost_micros; a begin above the ceiling is
	// denied, and still counted as declared.
	b.putPolicy("api.call", map[string]any{"structuring_threshold_micros": nil, "max_cost_micros": 20_000})
	b.mustBegin("denied", charge(key("over"), 30_000))
	s = b.structuring("api.call")
	require.EqualValues(t, 20_000, s["threshold_micros"])
	require.Equal(t, "max_cost_micros", s["threshold_from"])
	day, _ = windows(t, s)
	requireBands(t, day, 10, 8, 0, 0, 2) // 25 000 and the denied 30 000 at or above
}

// TestStructuringWithoutALineOrDeclarations: with neither field set only the
// declarations are counted; a type never begun answers zeros.
func TestStructuringWithoutALineOrDeclarations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := b.structuring("payment.send")
	require.Nil(t, s["threshold_micros"])
	require.Nil(t, s["threshold_from"])
	day, week := windows(t, s)
	for _, w := range []map[string]any{day, week} {
		require.EqualValues(t, 0, w["declared"])
		require.Nil(t, w["below_80_percent"])
		require.Nil(t, w["at_or_above"])
		require.Nil(t, w["share_just_below"])
	}
	b.mustBegin("execute", charge(key("x"), 5))
	day, _ = windows(t, b.structuring("api.call"))
	require.EqualValues(t, 1, day["declared"])
	require.Nil(t, day["from_90_to_100_percent"])

	b.putPolicy("payment.send", map[string]any{"structuring_threshold_micros": 100})
	day, _ = windows(t, b.structuring("payment.send"))
	requireBands(t, day, 0, 0, 0, 0, 0)
	require.Nil(t, day["share_just_below"])

	// A name no begin could give is a 400 at its field, as PUT answers it.
	require.Equal(t, []string{"effect_type"}, validationFields(t,
		b.env.Do("GET", "/api/v1/policies/Not%20A%20Type/structuring", b.ws.Key, nil)))
	require.Equal(t, []string{"effect_type"}, validationFields(t,
		b.env.Do("GET", "/api/v1/policies/"+strings.Repeat("a", 101), b.ws.Key, nil)))
	other := b.env.Signup()
	day, _ = windows(t, b.env.Must(http.StatusOK, "GET", "/api/v1/policies/api.call/structuring", other.Key, nil).JSON())
	require.EqualValues(t, 0, day["declared"], "another workspace's declarations")
}
