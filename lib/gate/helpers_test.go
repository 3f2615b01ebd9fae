package gate_test

import (
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// clock is a test clock shared by every instance of one test. It starts at
// noon UTC of the current day, not at the wall clock: tests move it on by
// up to a few hours and expect to stay within one UTC day (daily budgets
// and key ceilings reset at midnight UTC), and a run that began in the last
// minutes before midnight UTC failed them.
func newClock() *apitest.Clock {
	return apitest.NewClock(time.Now().UTC().Truncate(24 * time.Hour).Add(12 * time.Hour))
}

// bundle is one test's service instance, workspace and clock.
type bundle struct {
	t     *testing.T
	env   *apitest.Env
	ws    apitest.Workspace
	clock *apitest.Clock
}

// twoInstances starts two service instances on one clock and signs up a
// workspace: what a hammer spreads its racers over.
func twoInstances(t *testing.T) (*apitest.Clock, *apitest.Env, *apitest.Env, apitest.Workspace) {
	t.Helper()
	c := newClock()
	env1 := apitest.Start(t, apitest.WithNow(c.Now))
	env2 := apitest.Start(t, apitest.WithNow(c.Now))
	return c, env1, env2, env1.Signup()
}

func setup(t *testing.T) *bundle {
	t.Helper()
	c := newClock()
	env := apitest.Start(t, apitest.WithNow(c.Now))
	return &bundle{t: t, env: env, ws: env.Signup(), clock: c}
}

// key returns a fresh idempotency key unique to the test.
func key(prefix string) string { return prefix + ":" + ids.Random(8) }

func (b *bundle) begin(body map[string]any) *apitest.Response {
	b.t.Helper()
	return b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, body)
}

// mustBegin begins and requires the decision, returning the body.
func (b *bundle) mustBegin(decision string, body map[string]any) map[string]any {
	b.t.Helper()
	r := b.begin(body)
	status := http.StatusOK
	if decision == "denied" {
		status = http.StatusForbidden
	}
	require.Equal(b.t, status, r.Status, "begin: %s", r.Body)
	out := r.JSON()
	require.Equal(b.t, decision, out["decision"], "begin: %s", r.Body)
	return out
}

func (b *bundle) report(id, token, outcome string, result any) *apitest.Response {
	b.t.Helper()
	body := map[string]any{"lease_token": token, "outcome": outcome}
	if result != nil {
		body["result"] = result
	}
	return b.env.Do("POST", "/api/v1/effects/"+id+"/report", b.ws.Key, body)
}

// newGroup opens a group named name, under idempotency key k unless k is
// empty, and answers its id.
func (b *bundle) newGroup(name, k string) string {
	b.t.Helper()
	body := map[string]any{"name": name}
	if k != "" {
		body["idempotency_key"] = k
	}
	return str(b.env.Must(http.StatusCreated, "POST", "/api/v1/groups", b.ws.Key, body).JSON()["id"])
}

// groupStep makes body a forward step of group g that comp compensates (an
// email.retract naming no payload when comp is nil), and answers body.
func groupStep(g string, body, comp map[string]any) map[string]any {
	if comp == nil {
		comp = map[string]any{"effect_type": "email.retract"}
	}
	body["group_id"], body["compensation"] = g, comp
	return body
}

// groupWithStep opens a group (newGroup) and executes in it a new email
// step that an email.retract compensates (groupStep), reported succeeded.
// It answers the group's id, the step's begin body and its begin's answer.
func (b *bundle) groupWithStep(name, k string) (g string, step, begun map[string]any) {
	b.t.Helper()
	g = b.newGroup(name, k)
	step = groupStep(g, email(key("step")), nil)
	return g, step, b.executedAs("succeeded", step)
}

func (b *bundle) putPolicy(effectType string, body map[string]any) map[string]any {
	b.t.Helper()
	return b.env.Must(http.StatusOK, "PUT", "/api/v1/policies/"+effectType, b.ws.Key, body).JSON()
}

func (b *bundle) get(id string) map[string]any {
	b.t.Helper()
	return b.env.Must(http.StatusOK, "GET", "/api/v1/effects/"+id, b.ws.Key, nil).JSON()
}

func email(k string) map[string]any {
	return map[string]any{"effect_type": "email.send", "idempotency_key": k,
		"payload": map[string]any{"to": "user_123", "template": "welcome"}, "cost_micros": 0,
		"dimensions": map[string]any{"recipient": "user_123"}}
}

func str(v any) string { return fmt.Sprint(v) }

// keyID recovers a key's id from its secret (rk_<id body>_<random>).
func keyID(secret string) string {
	body := secret[len("rk_"):]
	return "key_" + body[:26]
}

func (b *bundle) agent() string {
	b.t.Helper()
	return b.env.Key(b.ws, map[string]any{"name": "agent", "preset": "AGENT"})
}

// errCode requires an error envelope with status and code and returns it.
func errCode(t *testing.T, r *apitest.Response, status int, code string) map[string]any {
	t.Helper()
	require.Equal(t, status, r.Status, "%s", r.Body)
	require.Equal(t, code, r.ErrorCode(), "%s", r.Body)
	return r.JSON()["error"].(map[string]any)
}

func validationFields(t *testing.T, r *apitest.Response) []string {
	t.Helper()
	e := errCode(t, r, http.StatusBadRequest, "invalid_request")
	var fields []string
	for _, v := range e["detail"].(map[string]any)["validation"].([]any) {
		fields = append(fields, v.(map[string]any)["field"].(string))
	}
	return fields
}
