package gate_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An earlier attempt's unknown outcome is not erased by a later attempt
// reported failed (QA): under on_indeterminate retry the effect stays
// indeterminate — listed, resolvable, holding its ceilings and stopping its
// group's rollback — until an operator resolves it. A failed retry says
// only that the retry did not happen.

func TestAFailedRetryKeepsTheEarlierUnknownOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "daily_budget_micros": 2000})
	group := str(b.env.Must(http.StatusCreated, "POST", "/api/v1/groups", b.ws.Key, map[string]any{"name": "g"}).JSON()["id"])
	body := charge(key("maybe"), 700)
	body["group_id"], body["compensation"] = group, map[string]any{"effect_type": "api.undo"}
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute) // attempt 1 lapses: it may have happened
	d2 := b.mustBegin("execute", body)
	id := str(d2["effect_id"])
	require.EqualValues(t, 2, d2["attempt"])

	r := b.report(id, str(d2["lease_token"]), "failed", nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	e := r.JSON()
	require.Equal(t, "indeterminate", e["state"], "attempt 1 may still have happened")
	atts := e["attempts"].([]any)
	require.Equal(t, "indeterminate", atts[0].(map[string]any)["outcome"])
	require.Equal(t, "failed", atts[1].(map[string]any)["outcome"])
	// Repeating the report answers the same.
	require.Equal(t, "indeterminate", b.report(id, str(d2["lease_token"]), "failed", nil).JSON()["state"])

	listed := b.env.Must(http.StatusOK, "GET", "/api/v1/effects?state=indeterminate&effect_type=api.call", b.ws.Key,
		nil).JSON()["data"].([]any)
	require.Len(t, listed, 1)
	unwind := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+group+"/unwind", b.ws.Key, nil).JSON()
	require.Equal(t, []any{id}, unwind["unresolved"], "a maybe stops the rollback")
	require.NotEqual(t, "unwound", unwind["state"])

	// Attempt 2's charge was given back; attempt 1's still counts.
	b.denialOf("budget_exceeded", charge(key("x"), 1301))
	b.mustBegin("execute", charge(key("y"), 1300))

	// The operator found attempt 1 failed at the vendor: its charge comes
	// back, the key is settled, the group's rollback goes on.
	res := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed"}).JSON()
	require.Equal(t, "failed", res["state"])
	atts = res["attempts"].([]any)
	require.Equal(t, "failed", atts[0].(map[string]any)["outcome"])
	require.NotNil(t, atts[0].(map[string]any)["resolved_at"])
	require.Equal(t, "failed", atts[1].(map[string]any)["outcome"])
	require.Nil(t, atts[1].(map[string]any)["resolved_at"], "the reported attempt was not the operator's to settle")
	b.mustBegin("execute", charge(key("z"), 700))
	unwind = b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+group+"/unwind", b.ws.Key, nil).JSON()
	require.Empty(t, unwind["unresolved"])
	require.Equal(t, "unwound", unwind["state"])
}

// Resolving settles every unknown attempt of the effect, and a failed
// resolution gives back all their charges, however many charged one counter.
func TestResolveSettlesEveryUnknownAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "daily_budget_micros": 3000})
	body := charge(key("twice"), 700)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	d3 := b.mustBegin("execute", body)
	id := str(d3["effect_id"])
	require.Equal(t, "indeterminate", b.report(id, str(d3["lease_token"]), "failed", nil).JSON()["state"])
	b.denialOf("budget_exceeded", charge(key("x"), 1601)) // 1400 held by attempts 1 and 2

	res := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed"}).JSON()
	require.Equal(t, "failed", res["state"])
	for i, want := range []string{"failed", "failed", "failed"} {
		require.Equal(t, want, res["attempts"].([]any)[i].(map[string]any)["outcome"], "attempt %d", i+1)
	}
	b.mustBegin("execute", charge(key("all"), 3000))
}

// The same through reconciliation: the vendor's record settles the effect
// and every unknown attempt, giving back their charges.
func TestReconcileSettlesAFailedRetrysUnknownAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "daily_budget_micros": 1500})
	k := key("recon")
	body := charge(k, 700)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", body)
	id := str(d2["effect_id"])
	require.Equal(t, "indeterminate", b.report(id, str(d2["lease_token"]), "failed", nil).JSON()["state"])
	from := b.clock.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	to := b.clock.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	out := b.env.Must(http.StatusOK, "POST", "/api/v1/reconcile", b.ws.Key, map[string]any{
		"effect_type": "api.call", "from": from, "to": to,
		"records": []any{map[string]any{"idempotency_key": k, "status": "failed", "amount_micros": 700}}}).JSON()
	resolved := out["resolved"].([]any)
	require.Len(t, resolved, 1, "%v", out)
	require.Equal(t, id, resolved[0].(map[string]any)["effect_id"])
	e := b.get(id)
	require.Equal(t, "failed", e["state"], "the vendor says it failed")
	require.Equal(t, "failed", e["attempts"].([]any)[0].(map[string]any)["outcome"])
	b.mustBegin("execute", charge(key("after"), 1500))
}

// A probe settles the unknown attempt before it (its holder checked the
// vendor first), so a later failure is a plain failure.
func TestAProbeSettlesTheUnknownAttemptBeforeIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "probe"})
	k := key("probed")
	b.mustBegin("execute", email(k))
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", email(k))
	require.Equal(t, true, d2["probe"])
	id := str(d2["effect_id"])
	require.Equal(t, "failed", b.report(id, str(d2["lease_token"]), "failed", nil).JSON()["state"])
	d3 := b.mustBegin("execute", email(k))
	require.Equal(t, false, d3["probe"])
	require.Equal(t, "failed", b.report(id, str(d3["lease_token"]), "failed", nil).JSON()["state"])
}
