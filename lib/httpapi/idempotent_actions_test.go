package httpapi_test

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/httpapi"
)

// keyedAction is an action whose repeat, sent after another actor changed
// what it changed, would undo that change: its first request (under an
// Idempotency-Key, its answer taken as lost), the other actor's change, and
// what must still hold after the first request is sent again under its key.
type keyedAction struct {
	method, path string
	body         any
	other        func()         // another actor's change, after the first request committed
	survived     func() bool    // the other actor's change still holds
	says         map[string]any // fields of the first answer: the state it made, read in its transaction
}

// keyedActions are the actions that take an Idempotency-Key though they
// create nothing, each set up in e by route name (other is a second
// operator key).
func keyedActions(e *jobsEnv, other string) map[string]keyedAction {
	e.T.Helper()
	ctx := context.Background()
	circuit := func(effectType string) map[string]any {
		for _, c := range e.Must(http.StatusOK, "GET", "/api/v1/circuits", other, nil).JSON()["data"].([]any) {
			if c := c.(map[string]any); c["effect_type"] == effectType {
				return c
			}
		}
		e.T.Fatalf("no circuit for %s", effectType)
		return nil
	}
	stopState := func() string {
		return e.Must(http.StatusOK, "GET", "/api/v1/circuits/stop", other, nil).JSON()["state"].(string)
	}
	endpoint := func(id string) map[string]any {
		return e.Must(http.StatusOK, "GET", "/api/v1/endpoints/"+id+"/policy", other, nil).JSON()
	}
	hook := e.Must(http.StatusCreated, "POST", "/api/v1/webhooks", other, hookBody).JSON()["id"].(string)
	paused := e.endpoint("paused-by-other")["id"].(string)
	resumed := e.endpoint("resumed-by-other")["id"].(string)
	e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+resumed+"/pause", other, nil)
	tripped := e.endpoint("tripped-again")["id"].(string)
	trip := func(id string) {
		_, err := e.App.Pool.Exec(ctx, `UPDATE job_endpoints SET circuit_state = 'open', circuit_opened_at = now(),
			circuit_probe_at = now() + interval '30 seconds', circuit_failures = 5 WHERE id = $1::text`, id)
		require.NoError(e.T, err)
	}
	trip(tripped)
	run := e.run()
	step := e.enqueue(run, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 1}})["stepId"].(string)
	e.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", other, nil)
	policy := func() map[string]any {
		return e.Must(http.StatusOK, "GET", "/api/v1/policies/push.send", other, nil).JSON()
	}
	return map[string]keyedAction{
		"policies.put": {method: "PUT", path: "/api/v1/policies/push.send", body: map[string]any{"max_attempts": 2},
			other: func() {
				e.Must(http.StatusOK, "PUT", "/api/v1/policies/push.send", other, map[string]any{"max_attempts": 7})
			},
			survived: func() bool { return policy()["max_attempts"] == float64(7) },
			says:     map[string]any{"max_attempts": float64(2), "version": float64(1)}},
		"circuits.open": {method: "POST", path: "/api/v1/circuits/email.send/open", body: map[string]any{"action": "deny"},
			other:    func() { e.Must(http.StatusOK, "POST", "/api/v1/circuits/email.send/close", other, nil) },
			survived: func() bool { return circuit("email.send")["state"] == "closed" },
			says:     map[string]any{"state": "open", "action": "deny"}},
		"circuits.close": {method: "POST", path: "/api/v1/circuits/sms.send/close",
			other:    func() { e.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", other, nil) },
			survived: func() bool { return circuit("sms.send")["state"] == "open" },
			says:     map[string]any{"state": "closed"}},
		"circuits.stop": {method: "POST", path: "/api/v1/circuits/stop", body: map[string]any{"reason": "incident"},
			other:    func() { e.Must(http.StatusOK, "POST", "/api/v1/circuits/release", other, nil) },
			survived: func() bool { return stopState() == "closed" }},
		"circuits.release": {method: "POST", path: "/api/v1/circuits/release",
			other: func() {
				e.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", other, map[string]any{"reason": "new incident"})
			},
			survived: func() bool { return stopState() == "open" }},
		"steps.cancel": {method: "POST", path: "/api/v1/steps/" + step + "/cancel",
			other: func() {
				e.Must(http.StatusOK, "POST", "/api/v1/steps/"+step+"/replay", other,
					map[string]any{"acknowledgeDuplicateRisk": true})
			},
			survived: func() bool { return e.stepOf(step)["status"] == "QUEUED" },
			says:     map[string]any{"status": "CANCELLED"}},
		"endpoints.pause": {method: "POST", path: "/api/v1/endpoints/" + paused + "/pause",
			other:    func() { e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+paused+"/resume", other, nil) },
			survived: func() bool { return endpoint(paused)["paused"] == false },
			says:     map[string]any{"paused": true}},
		"endpoints.resume": {method: "POST", path: "/api/v1/endpoints/" + resumed + "/resume",
			other:    func() { e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+resumed+"/pause", other, nil) },
			survived: func() bool { return endpoint(resumed)["paused"] == true },
			says:     map[string]any{"paused": false}},
		"endpoints.circuit.close": {method: "POST", path: "/api/v1/endpoints/" + tripped + "/circuit/close",
			other: func() { trip(tripped) },
			survived: func() bool {
				return endpoint(tripped)["circuit"].(map[string]any)["state"] == "open"
			}},
		"webhooks.update": {method: "PATCH", path: "/api/v1/webhooks/" + hook, body: map[string]any{"disabled": true},
			other: func() {
				e.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+hook, other, map[string]any{"disabled": false})
			},
			survived: func() bool {
				return e.Must(http.StatusOK, "GET", "/api/v1/webhooks/"+hook, other, nil).JSON()["disabled"] == false
			},
			says: map[string]any{"disabled": true}},
	}
}

// An action whose answer was lost, sent again after another actor changed
// what it changed, is answered its first answer under its Idempotency-Key
// and undoes nothing: a retried close no longer closed a breaker tripped
// again since, a retried release no longer lifted another operator's new
// stop, a retried cancel no longer cancelled a replay, a retried pause no
// longer paused a resumed endpoint (the header was ignored on these
// routes, and the SDKs retry them), and a policy update sent again no
// longer wrote over another operator's. Every action that takes the header
// for that reason is here, each on its own route.
func TestARetriedActionUndoesNoChangeMadeSince(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	other := e.Key(e.ws, map[string]any{"name": "second operator", "preset": "OPERATOR"})
	actions := keyedActions(e, other)
	routes := httpapi.Routes()
	for _, name := range slices.Sorted(maps.Keys(actions)) {
		t.Run(name, func(t *testing.T) {
			i := slices.IndexFunc(routes, func(r httpapi.Route) bool { return r.Name == name })
			require.GreaterOrEqual(t, i, 0)
			a := actions[name]
			require.Equal(t, a.method, routes[i].Method)
			key := idemKey("first:" + name)
			first := e.DoWith(a.method, a.path, e.ws.Key, key, a.body)
			require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)
			require.Empty(t, first.Header.Get(httpapi.ReplayedHeader))
			for field, want := range a.says {
				require.Equal(t, want, first.JSON()[field], field)
			}

			a.other()
			require.True(t, a.survived(), "the other actor's change is made")

			again := e.DoWith(a.method, a.path, e.ws.Key, key, a.body)
			require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
			require.True(t, a.survived(), "the retry undid the other actor's change")
			require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader), "answered again")
			require.Equal(t, first.Header.Get("X-Request-Id"), again.Header.Get(httpapi.OriginalRequestHeader))
			require.Equal(t, string(first.Body), string(again.Body))
			require.True(t, routes[i].Idempotent, "takes an Idempotency-Key")
		})
	}
}

// A keyed action's work commits with its kept answer or not at all: a
// pause whose request rolled back after the pause (its claim taken over
// meanwhile, so that its answer could not be recorded) leaves the endpoint
// unpaused. Written on the pool, outside the request's transaction, the
// pause committed alone, and the retry under the key would pause again
// over a resume made since.
func TestAKeyedPauseThatRollsBackLeavesTheEndpointUnpaused(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	ep := e.endpoint("rolled-back-pause")["id"].(string)
	srv := keyedServer(e.Env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		paused, err := e.App.Server.Jobs.SetPaused(ctx, c.Principal.WorkspaceID, ep, true)
		if err != nil {
			return nil, err
		}
		// What a retry after the lapse does: take the key over (committed,
		// on a connection of its own).
		_, err = e.App.Pool.Exec(context.Background(), `UPDATE idempotent_requests SET request_id = 'req_other'
			WHERE key_id = $1 AND idempotency_key = 'create-pause'`, c.Principal.KeyID)
		return paused, err
	})
	late := sendKeyed(srv, e.ws.Key, "pause")
	require.Equal(t, http.StatusConflict, late.Code, "%s", late.Body)
	require.Contains(t, late.Body.String(), `"code":"retry_request"`)
	require.Equal(t, false, e.Must(http.StatusOK, "GET", "/api/v1/endpoints/"+ep+"/policy", e.ws.Key, nil).JSON()["paused"],
		"the pause rolled back with its request")
}
