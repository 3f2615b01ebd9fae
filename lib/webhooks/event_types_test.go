package webhooks_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	env, clk, ws, rcv := subscribedToAll(t)
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
		if ev.Type == events.StepExhausted || ev.Type == events.StepReplayed {
			// Its subject is the step: data names the run a receiver
			// reads (both named only the job, QA).
			require.Equal(t, run["id"], ev.Data["runId"], "%s names the step's run: %s", ev.Type, body)
		}
	}
	for _, typ := range events.Types {
		require.NotZero(t, seen[typ], "%s was sent (sent: %v)", typ, seen)
	}
	// No reminders left for the later tests' sweeps (the outbox is the
	// package database's).
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/charge.create", ws.Key, map[string]any{"reconcile_every_hours": nil})
}

// subscribedToAll starts a server with a workspace whose receiver is
// subscribed to every event type, until the test ends: the later tests'
// sweeps send it nothing (the outbox is the package database's).
func subscribedToAll(t *testing.T) (*apitest.Env, *apitest.Clock, apitest.Workspace, *receiver) {
	env, clk := start(t, true)
	ws := env.Signup()
	rcv := newReceiver(t)
	id := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": rcv.URL, "events": events.Types}).JSON()["id"].(string)
	t.Cleanup(func() { env.Must(http.StatusOK, "DELETE", "/api/v1/webhooks/"+id, ws.Key, nil) })
	return env, clk, ws, rcv
}

// A delivery's data carries the names it names as they are: only the
// times SQL wrote (keys ending _at, read +00:00 from the outbox) are sent
// with Z. An endpoint may be named like a time ("printable, without white
// space at either end"), and so may a handler version; rewritten, the
// circuit.closed of endpoint "2026-12-07T09:00:00+00:00" named an endpoint
// that does not exist, and a step.replayed's newHandlerVersion one no
// worker registers (events QA).
func TestADeliverySendsNamesThatReadLikeTimesAsTheyAre(t *testing.T) {
	env, clk, ws, rcv := subscribedToAll(t)
	const name = "2026-12-07T09:00:00+00:00"
	ep := env.Must(http.StatusCreated, "POST", "/api/v1/endpoints", ws.Key, map[string]any{"name": name}).JSON()
	require.Equal(t, name, ep["name"])
	_, err := env.App.Pool.Exec(context.Background(), `UPDATE job_endpoints SET circuit_state = 'open',
		circuit_opened_at = $2 WHERE id = $1`, ep["id"], clk.Now().Add(-time.Minute))
	require.NoError(t, err)
	env.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+ep["id"].(string)+"/circuit/close", ws.Key, nil)

	env.App.Sweeper.RunOnce(context.Background())
	require.Equal(t, 1, rcv.count())
	var got struct {
		SubjectID string         `json:"subject_id"`
		Data      map[string]any `json:"data"`
	}
	require.NoError(t, json.Unmarshal(rcv.bodies[0], &got))
	require.Equal(t, ep["id"], got.SubjectID)
	require.Equal(t, name, got.Data["endpoint"], "the endpoint's name, as its reads show it")
}

// A tool test's step.exhausted and run.finished are sent, as any run's
// (visibility), and say in data.synthetic that they are a tool test's, so a
// receiver paging on a failure can tell one from production: they said
// nothing of it (events QA). Both ways a step is exhausted: a failed report
// and a lapsed lease (the sweeper's); an ordinary run's say false.
func TestAToolTestsEventsSayTheyAreSynthetic(t *testing.T) {
	env, clk, ws, rcv := subscribedToAll(t)
	must := func(status int, method, path string, body any) map[string]any {
		t.Helper()
		clk.Add(time.Millisecond)
		return env.Must(status, method, path, ws.Key, body).JSON()
	}
	synthetic := map[string]bool{} // subject (run or step) → data.synthetic expected
	runOf := map[string]any{}      // step → its run, which its step.exhausted names
	for range 2 {
		run := must(http.StatusCreated, "POST", "/api/v1/runs", map[string]any{"name": "welcome"})
		step := must(http.StatusCreated, "POST", "/api/v1/runs/"+run["id"].(string)+"/steps", map[string]any{
			"name": "send_mail", "version": "1", "input": map[string]any{}, "maxAttempts": 1})
		synthetic[run["id"].(string)], synthetic[step["stepId"].(string)] = false, false
		tested := must(http.StatusOK, "POST", "/api/v1/tools/send_mail/test", map[string]any{"version": "1", "input": map[string]any{}})
		synthetic[tested["runId"].(string)], synthetic[tested["stepId"].(string)] = true, true
		runOf[step["stepId"].(string)], runOf[tested["stepId"].(string)] = run["id"], tested["runId"]
	}
	worker := must(http.StatusCreated, "POST", "/api/v1/workers/register",
		map[string]any{"tools": []any{map[string]any{"name": "send_mail", "version": "1"}}})
	jobs := must(http.StatusOK, "POST", "/api/v1/workers/"+worker["workerId"].(string)+"/claim",
		map[string]any{"limit": 4, "waitSeconds": 0})["jobs"].([]any)
	require.Len(t, jobs, 4)
	// One ordinary step and one tool test fail by report; the others' leases lapse.
	failed := map[bool]bool{}
	for _, j := range jobs {
		job := j.(map[string]any)
		tool := synthetic[job["stepId"].(string)]
		if failed[tool] {
			continue
		}
		failed[tool] = true
		must(http.StatusOK, "POST", "/api/v1/jobs/"+job["jobId"].(string)+"/report", map[string]any{
			"leaseToken": job["leaseToken"], "status": "FAILED", "error": map[string]any{"message": "refused", "retryable": false}})
	}
	require.Len(t, failed, 2)
	clk.Add(2 * time.Hour) // the other two leases lapsed
	for range 2 {          // a pass records the lapses; the next sends what it fanned out
		env.App.Sweeper.RunOnce(context.Background())
	}

	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	seen := map[string]int{} // type, and a step's way of ending, with data.synthetic
	for _, body := range rcv.bodies {
		var ev struct {
			Type      string         `json:"type"`
			SubjectID string         `json:"subject_id"`
			Data      map[string]any `json:"data"`
		}
		require.NoError(t, json.Unmarshal(body, &ev))
		want, ok := synthetic[ev.SubjectID]
		require.True(t, ok, "an event of this test's runs and steps: %s", body)
		require.Equal(t, want, ev.Data["synthetic"], "%s", body)
		if ev.Type == events.StepExhausted {
			require.Equal(t, runOf[ev.SubjectID], ev.Data["runId"], "a step.exhausted names its step's run: %s", body)
		}
		seen[fmt.Sprintf("%s lapsed=%v synthetic=%v", ev.Type, ev.Data["leaseLapsed"], want)]++
	}
	require.Equal(t, map[string]int{
		"step.exhausted lapsed=false synthetic=false": 1, "step.exhausted lapsed=false synthetic=true": 1,
		"step.exhausted lapsed=true synthetic=false": 1, "step.exhausted lapsed=true synthetic=true": 1,
		"run.finished lapsed=<nil> synthetic=false": 2, "run.finished lapsed=<nil> synthetic=true": 2,
	}, seen, "every step exhausted, by report or lapse, and every run failed")
}
