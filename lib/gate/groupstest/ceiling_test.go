package groupstest

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGroupedBeginOverACeilingIsDenied covers the meeting of two features: a
// grouped begin runs in a transaction, and a grant that does not fit a daily
// budget aborts its statement; the begin must still answer a stored denial,
// never an error, and keep nothing of the refused grant.
func TestGroupedBeginOverACeilingIsDenied(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/vendor.call", map[string]any{"daily_budget_micros": 100})
	g := f.group()
	first := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", map[string]any{"effect_type": "vendor.call",
		"idempotency_key": "over:1", "cost_micros": 60, "group_id": g})
	require.Equal(t, "execute", first["decision"])

	r := f.do("POST", "/api/v1/effects/begin", map[string]any{"effect_type": "vendor.call",
		"idempotency_key": "over:2", "cost_micros": 60, "group_id": g})
	require.Equal(t, http.StatusForbidden, r.Status, "%s", r.Body)
	body := r.JSON()
	require.Equal(t, "denied", body["decision"])
	require.Equal(t, "budget_exceeded", body["error"].(map[string]any)["code"])

	// The denied step joined the group as a denial, and the budget still
	// admits what fits.
	got := f.must(http.StatusOK, "GET", "/api/v1/effects/"+body["effect_id"].(string), nil)
	require.Equal(t, "denied", got["state"])
	fits := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", map[string]any{"effect_type": "vendor.call",
		"idempotency_key": "over:3", "cost_micros": 40, "group_id": g})
	require.Equal(t, "execute", fits["decision"])
}
