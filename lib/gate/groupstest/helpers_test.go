package groupstest

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// fx is one test's app, workspace and clock.
type fx struct {
	t     *testing.T
	env   *apitest.Env
	ws    apitest.Workspace
	clock *apitest.Clock
}

func setupAt(t *testing.T, at time.Time) *fx {
	t.Helper()
	c := apitest.NewClock(at)
	env := apitest.Start(t, apitest.WithNow(c.Now))
	return &fx{t: t, env: env, ws: env.Signup(), clock: c}
}

// setup starts the clock at noon UTC of the current day, not at the wall
// clock: tests move it on by up to a few hours and expect to stay within
// one UTC day (daily budgets reset at midnight UTC), and a run that began
// in the last minutes before midnight UTC failed them.
func setup(t *testing.T) *fx {
	return setupAt(t, time.Now().UTC().Truncate(24*time.Hour).Add(12*time.Hour))
}

func (f *fx) do(method, path string, body any) *apitest.Response {
	f.t.Helper()
	return f.env.Do(method, path, f.ws.Key, body)
}

func (f *fx) must(status int, method, path string, body any) map[string]any {
	f.t.Helper()
	return f.env.Must(status, method, path, f.ws.Key, body).JSON()
}

func (f *fx) group() string {
	f.t.Helper()
	g := f.must(http.StatusCreated, "POST", "/api/v1/groups", map[string]any{"name": "checkout"})
	require.Equal(f.t, "open", g["state"])
	require.True(f.t, ids.Valid(ids.Group, g["id"].(string)))
	return g["id"].(string)
}

// step begins a forward step of group (with a compensation unless comp is
// false) and returns the effect id and lease token.
func (f *fx) step(group string, comp bool) (string, string) {
	f.t.Helper()
	d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", stepBody(group, comp))
	require.Equal(f.t, "execute", d["decision"])
	return d["effect_id"].(string), d["lease_token"].(string)
}

// stepBody is the begin of a new forward step of group, under a key of its
// own, with a compensation unless comp is false.
func stepBody(group string, comp bool) map[string]any {
	body := map[string]any{"effect_type": "payment.charge", "idempotency_key": "charge:" + ids.Random(6),
		"payload": map[string]any{"order": ids.Random(4)}, "cost_micros": 1000, "group_id": group}
	if comp {
		body["compensation"] = map[string]any{"effect_type": "payment.refund",
			"payload": map[string]any{"refund_of": "charge"}}
	}
	return body
}

func (f *fx) report(id, token, outcome string) map[string]any {
	f.t.Helper()
	return f.must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/report",
		map[string]any{"lease_token": token, "outcome": outcome})
}

// done begins a step and reports it succeeded, one second after the last.
func (f *fx) done(group string, comp bool) string {
	f.t.Helper()
	f.clock.Add(time.Second)
	id, tok := f.step(group, comp)
	f.report(id, tok, "succeeded")
	return id
}

func (f *fx) unwind(group string) map[string]any {
	f.t.Helper()
	return f.must(http.StatusOK, "POST", "/api/v1/groups/"+group+"/unwind", nil)
}

func (f *fx) state(group string) string {
	f.t.Helper()
	return f.must(http.StatusOK, "GET", "/api/v1/groups/"+group, nil)["state"].(string)
}

// stored reads group's state from its row, not through GET (which settles
// the group first): what the request before it left.
func (f *fx) stored(group string) string {
	f.t.Helper()
	var state string
	require.NoError(f.t, f.env.App.Pool.QueryRow(context.Background(),
		`SELECT state FROM effect_groups WHERE id = $1`, group).Scan(&state))
	return state
}

// planIDs lists the effect ids of an unwind's plan in order.
func planIDs(u map[string]any) []string {
	out := []string{}
	for _, it := range u["plan"].([]any) {
		out = append(out, it.(map[string]any)["effect_id"].(string))
	}
	return out
}

func strs(v any) []string {
	out := []string{}
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

// retryRefunds lets the compensations' type (payment.refund) be retried
// after an unknown outcome, up to maxAttempts attempts of 5 s leases.
func (f *fx) retryRefunds(maxAttempts int) {
	f.t.Helper()
	f.must(http.StatusOK, "PUT", "/api/v1/policies/payment.refund", map[string]any{"lease_seconds": 5,
		"max_attempts": maxAttempts, "on_indeterminate": "retry"})
}

// compensate performs one plan item: begin it as the plan says, and report
// outcome (nothing when outcome is "").
func (f *fx) compensate(item map[string]any, outcome string) string {
	f.t.Helper()
	comp := item["compensation"].(map[string]any)
	d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", map[string]any{
		"effect_type": comp["effect_type"], "payload": comp["payload"], "cost_micros": 0,
		"idempotency_key": item["suggested_idempotency_key"], "compensates_effect_id": item["compensates_effect_id"]})
	require.Equal(f.t, "execute", d["decision"])
	if outcome != "" {
		f.report(d["effect_id"].(string), d["lease_token"].(string), outcome)
	}
	return d["effect_id"].(string)
}

// compensatedOnce sets the compensations' type's policy (payment.refund)
// to policy, rolls back a group of one compensable step a, and performs
// the plan's compensation c once, reported outcome (nothing when ""). It
// answers the group, the step, the compensation and the begin that
// compensates the step again.
func (f *fx) compensatedOnce(policy map[string]any, outcome string) (g, a, c string, again map[string]any) {
	f.t.Helper()
	f.must(http.StatusOK, "PUT", "/api/v1/policies/payment.refund", policy)
	g = f.group()
	a = f.done(g, true)
	item := f.unwind(g)["plan"].([]any)[0].(map[string]any)
	c = f.compensate(item, outcome)
	comp := item["compensation"].(map[string]any)
	return g, a, c, map[string]any{"effect_type": comp["effect_type"], "payload": comp["payload"],
		"cost_micros": 0, "idempotency_key": item["suggested_idempotency_key"], "compensates_effect_id": a}
}

// irreversible requires the rollback of group g to have ended with step a
// irreversible and nothing left to do.
func (f *fx) irreversible(g, a string) {
	f.t.Helper()
	u := f.unwind(g)
	require.Equal(f.t, []string{a}, strs(u["irreversible"]))
	require.Empty(f.t, u["plan"])
}

func errCode(t *testing.T, r *apitest.Response, status int, code string) {
	t.Helper()
	require.Equal(t, status, r.Status, "%s", r.Body)
	require.Equal(t, code, r.ErrorCode(), "%s", r.Body)
}

// validationFieldsOf lists the fields of a 400's detail.validation.
func validationFieldsOf(t *testing.T, r *apitest.Response) []string {
	t.Helper()
	require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
	var fields []string
	for _, v := range r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["validation"].([]any) {
		fields = append(fields, v.(map[string]any)["field"].(string))
	}
	return fields
}
