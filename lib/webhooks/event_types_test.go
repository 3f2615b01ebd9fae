package webhooks_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// Every event type a subscription may name is sent, made by the API's own
// transitions, with the data the OpenAPI document's webhooks give its type:
// each documented field, typed as documented (times in UTC), and no other.
// Only step.exhausted's and the emergency stop's data were documented
// (events QA).
func TestEveryEventTypeIsDeliveredAsTheDocumentSaysIt(t *testing.T) {
	env, clk := start(t, true)
	ws := env.Signup()
	rcv := newReceiver(t)
	env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": rcv.URL, "events": events.Types})
	must := func(status int, method, path string, body any) map[string]any {
		t.Helper()
		clk.Add(time.Millisecond) // transitions in the order made
		return env.Must(status, method, path, ws.Key, body).JSON()
	}

	// The gate: a lapse, an approval asked for and given, a breaker and
	// the emergency stop opened and closed, a reconciliation falling due.
	must(http.StatusOK, "POST", "/api/v1/effects/begin", map[string]any{"effect_type": "email.send",
		"idempotency_key": "lapses", "payload": map[string]any{}, "lease_seconds": 5})
	must(http.StatusOK, "PUT", "/api/v1/policies/wire.send", map[string]any{"mode": "require_approval"})
	asked := must(http.StatusOK, "POST", "/api/v1/effects/begin", map[string]any{"effect_type": "wire.send",
		"idempotency_key": "asks", "payload": map[string]any{}})
	require.Equal(t, "approval_required", asked["decision"])
	must(http.StatusOK, "POST", "/api/v1/approvals/"+asked["approval_id"].(string)+"/approve", map[string]any{"note": "ok"})
	must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", map[string]any{"action": "deny", "reason": "by hand"})
	must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", nil)
	must(http.StatusOK, "POST", "/api/v1/circuits/stop", map[string]any{"action": "deny", "reason": "by hand"})
	must(http.StatusOK, "POST", "/api/v1/circuits/release", nil)
	must(http.StatusOK, "PUT", "/api/v1/policies/charge.create", map[string]any{"reconcile_every_hours": 1})

	// Durable jobs: a step exhausted on an endpoint whose circuit opens at
	// one failure (its run failing), the circuit closed, the step replayed.
	ep := must(http.StatusCreated, "POST", "/api/v1/endpoints", map[string]any{"name": "mailer", "circuitFailureThreshold": 1})
	run := must(http.StatusCreated, "POST", "/api/v1/runs", map[string]any{"name": "welcome"})
	step := must(http.StatusCreated, "POST", "/api/v1/runs/"+run["id"].(string)+"/steps", map[string]any{
		"name": "send_mail", "version": "1", "input": map[string]any{}, "endpoint": "mailer", "maxAttempts": 1})
	worker := must(http.StatusCreated, "POST", "/api/v1/workers/register",
		map[string]any{"tools": []any{map[string]any{"name": "send_mail", "version": "1"}}})
	jobs := must(http.StatusOK, "POST", "/api/v1/workers/"+worker["workerId"].(string)+"/claim",
		map[string]any{"limit": 1, "waitSeconds": 0})["jobs"].([]any)
	require.Len(t, jobs, 1)
	job := jobs[0].(map[string]any)
	must(http.StatusOK, "POST", "/api/v1/jobs/"+job["jobId"].(string)+"/report", map[string]any{
		"leaseToken": job["leaseToken"], "status": "FAILED", "error": map[string]any{"message": "refused", "retryable": false}})
	must(http.StatusOK, "POST", "/api/v1/endpoints/"+ep["id"].(string)+"/circuit/close", nil)
	must(http.StatusOK, "POST", "/api/v1/steps/"+step["stepId"].(string)+"/replay",
		map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 1})

	clk.Add(2 * time.Hour) // the lease lapsed, the reconciliation is due
	for range 2 {          // a pass records the lapse and the reminder; the next sends what it fanned out
		env.App.Sweeper.RunOnce(context.Background())
	}

	raw, err := json.Marshal(httpapi.OpenAPI())
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	documented := func(typ string) [][]string {
		data := apitest.At(doc, "webhooks", typ, "post", "requestBody", "content", "application/json", "schema")
		data = apitest.At(apitest.At(data, "allOf").([]any)[1], "properties", "data")
		variants := []any{data}
		if oneOf, ok := apitest.At(data, "oneOf").([]any); ok {
			variants = oneOf
		}
		var out [][]string
		for _, v := range variants {
			out = append(out, slices.Sorted(maps.Keys(apitest.At(v, "properties").(map[string]any))))
		}
		return out
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	seen := map[string]int{}
	for i, body := range rcv.bodies {
		apitest.CheckDelivery(t, rcv.headers[i], body)
		var ev struct {
			Type string         `json:"type"`
			Data map[string]any `json:"data"`
		}
		require.NoError(t, json.Unmarshal(body, &ev))
		seen[ev.Type]++
		require.Contains(t, documented(ev.Type), slices.Sorted(maps.Keys(ev.Data)),
			"%s's data has exactly the fields documented: %s", ev.Type, body)
	}
	for _, typ := range events.Types {
		require.NotZero(t, seen[typ], "%s was sent (sent: %v)", typ, seen)
	}
}
